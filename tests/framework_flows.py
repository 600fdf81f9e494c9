"""What the voice-agent framework tests share (tests/test_pipecat.py, tests/test_livekit.py): the simulator server,
its speech at the rate a framework sends, the utterances each flow speaks, and the error events the server sent.

Each framework runs in a venv of its own (their pins differ); this module imports neither.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Iterator

import numpy as np
import soxr

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.server import ServerConfig

from .server_fixture import running_app

MODEL = "sim"
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
WEATHER_CALL = 'call get_weather {"city": "Paris"}'
"""What the simulator hears as a call of ``get_weather`` (with that tool configured)."""
WEATHER_RESULT = '{"city": "Paris", "temp_c": 21}'
LONG_UTTERANCE = "please tell me everything you know about the sea, the ships and the harbours of the north"
"""Long enough that its answer ("You said: …") is still playing when the user speaks again."""

_SENT_ERROR = re.compile(r"session (\S+) sent error (\S+)")


def speech(text: str, rate: int) -> bytes:
    """Simulator speech of ``text`` as PCM16 mono at ``rate`` Hz (what a framework's microphone would carry)."""
    pcm = np.frombuffer(render_speech(text), dtype="<i2")
    if rate == 16_000:
        return pcm.tobytes()
    return soxr.resample(pcm, 16_000, rate).astype("<i2").tobytes()


def silence(seconds: float, rate: int) -> bytes:
    return bytes(2 * int(seconds * rate))


class ServerErrors(logging.Handler):
    """Every error event the server sent, as ``(session_id, code)``: the server logs a warning for each."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.sent: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = _SENT_ERROR.fullmatch(record.getMessage())
        if m:
            self.sent.append((m.group(1), m.group(2)))

    def codes(self) -> list[str]:
        return [code for _, code in self.sent]


@contextlib.contextmanager
def simulator_server(max_sessions: int = 2) -> Iterator[tuple[str, ServerErrors]]:
    """The simulator server (http://, as a framework's base URL takes it) and the errors it sends."""
    errors = ServerErrors()
    logger = logging.getLogger("vllm_omni_voicechat.server")
    logger.addHandler(errors)
    try:
        with running_app(ServerConfig.simulator(max_sessions=max_sessions)) as (base, _):
            yield base, errors
    finally:
        logger.removeHandler(errors)


class Microphone:
    """A framework's microphone: 20 ms frames at ``rate``, silence unless the flow said something (each utterance
    followed by a second of silence). ``run(push)`` hands each frame to the framework, paced as a capture device."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._speech: asyncio.Queue[bytes] = asyncio.Queue()

    def say(self, text: str) -> None:
        self._speech.put_nowait(speech(text, self.rate) + silence(1.0, self.rate))

    async def run(self, push: Callable[[bytes], Awaitable[None] | None]) -> None:
        frame = 2 * self.rate // 50
        pending = b""
        while True:
            if not pending and not self._speech.empty():
                pending = self._speech.get_nowait()
            chunk, pending = (pending[:frame], pending[frame:]) if pending else (silence(0.02, self.rate), b"")
            pushed = push(chunk)
            if pushed is not None:
                await pushed
            await asyncio.sleep(0.02)  # ok: a capture device's pace; outcomes wait on conditions, never on it


async def until(predicate: Callable[[], bool], changed: asyncio.Event, timeout_s: float) -> None:
    """Waits until ``predicate`` holds, re-checking whenever ``changed`` is set (the flow's bound: ``timeout_s``)."""
    async def wait() -> None:
        while not predicate():
            changed.clear()
            await changed.wait()

    await asyncio.wait_for(wait(), timeout_s)
