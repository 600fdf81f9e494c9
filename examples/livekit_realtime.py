"""LiveKit Agents' OpenAI Realtime model (``livekit.plugins.openai.realtime.RealtimeModel``), unmodified, against
this server's OpenAI-compatible lane (``/v1/realtime?model=...``), without a room, with a local function tool.

The session is the one an ``AgentSession`` drives; here the script plays the agent's part: it greets with
``generate_reply()``, pushes each ``--say`` utterance as a 48 kHz room track's 20 ms frames (LiveKit resamples to
the 24 kHz it sends) with silence in between, and answers a function call as LiveKit's agent does (the output
through ``update_chat_ctx``, then ``generate_reply(tool_choice="auto")``). Turns end by the model's own end of
turn (LiveKit's default ``semantic_vad``). Against the simulator, utterances are rendered as simulator speech and
``call NAME {json}`` makes it call a tool; against a real model use ``--wav``. Prints the conversation as LiveKit
reports it and writes the agent's audio to one 24 kHz WAV.

Needs ``pip install livekit-agents==1.8.9 livekit-plugins-openai==1.8.9`` (a venv of its own keeps its pins
apart). LiveKit wants an API key (any string does here) and reads ``OPENAI_API_VERSION`` as Azure mode: unset it.

    vllm-omni-voicechat serve --port 8765 &
    python examples/livekit_realtime.py --url http://127.0.0.1:8765
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import date, timedelta
from pathlib import Path

import aiohttp
import numpy as np
import soxr
from livekit import rtc
from livekit.agents import APIConnectOptions, llm
from livekit.plugins.openai.realtime import RealtimeModel

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.audio.wav import load_wav_16k, write_wav

ROOM_RATE = 48_000  # what a room's track carries
FRAME_BYTES = 2 * ROOM_RATE // 50  # 20 ms
OUT_RATE = 24_000  # what LiveKit's generations carry
DEFAULT_SAY = 'call date_after {"start": "2026-11-30", "days": 30}'


@llm.function_tool
async def date_after(start: str, days: int) -> str:
    """The date a number of days after a start date (ISO format, e.g. 2026-11-30), with its weekday."""
    try:
        end = date.fromisoformat(start) + timedelta(days=int(days))
    except ValueError as error:
        return f"cannot compute that: {error}"
    return f"{end.isoformat()}, a {end:%A}"


def to_48k(pcm16_16k: bytes) -> bytes:
    samples = np.frombuffer(pcm16_16k, dtype="<i2")
    return soxr.resample(samples, 16_000, ROOM_RATE).astype("<i2").tobytes()


class Conversation:
    """What LiveKit reports: transcripts of the user, each generation's text and audio, function calls, errors."""

    def __init__(self, session: llm.RealtimeSession) -> None:
        self.session = session
        self.lines: list[str] = []
        self.audio = bytearray()
        self.errors: list[str] = []
        self.answers = 0
        self.changed = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        session.on("input_audio_transcription_completed", self._on_transcript)
        session.on("generation_created", lambda ev: self._spawn(self._generation(ev)))
        session.on("error", lambda ev: self._note(self.errors.append(str(ev.error))))

    def _note(self, _: object = None) -> None:
        self.changed.set()

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_transcript(self, ev: llm.InputTranscriptionCompleted) -> None:
        if ev.is_final:
            self.lines.append(f"user: {ev.transcript}")
            self._note()

    async def _generation(self, ev: llm.GenerationCreatedEvent) -> None:
        async def message(msg: llm.MessageGeneration) -> str:
            async def audio() -> None:
                async for frame in msg.audio_stream:
                    self.audio += frame.data.tobytes()

            reader = asyncio.create_task(audio())
            text = "".join([str(chunk) async for chunk in msg.text_stream])
            await reader
            return text

        async def messages() -> list[str]:
            readers = [asyncio.create_task(message(m)) async for m in ev.message_stream]
            return list(await asyncio.gather(*readers))

        calls: list[llm.FunctionCall] = []

        async def function_calls() -> None:
            async for call in ev.function_stream:
                calls.append(call)

        texts, _ = await asyncio.gather(messages(), function_calls())
        for text in texts:
            if text:
                self.lines.append(f"assistant: {text}")
                self.answers += 1
        if calls:
            await self._run_tools(calls)
        self._note()

    async def _run_tools(self, calls: list[llm.FunctionCall]) -> None:
        """As LiveKit's agent does after a tool: the outputs into the chat context, then a reply."""
        ctx = self.session.chat_ctx.copy()
        for call in calls:
            args = json.loads(call.arguments or "{}")
            output = await date_after(**args) if call.name == "date_after" else f"no tool {call.name}"
            self.lines.append(f"tool {call.name}({json.dumps(args, sort_keys=True)}) -> {output!r}")
            ctx.items.append(llm.FunctionCallOutput(call_id=call.call_id, name=call.name, output=output,
                                                    is_error=False))
        await self.session.update_chat_ctx(ctx)
        await self.session.generate_reply(tool_choice="auto")


async def converse(url: str, model_name: str, utterances: list[bytes], timeout: float = 60.0) -> Conversation:
    async with aiohttp.ClientSession() as http:
        model = RealtimeModel(model=model_name, api_key="unused", base_url=f"{url}/v1", http_session=http,
                              max_session_duration=None, conn_options=APIConnectOptions(max_retry=0))
        session = model.session()
        watch = Conversation(session)
        speech = [pcm + bytes(2 * ROOM_RATE) for pcm in utterances]  # a second of silence: the model ends the turn

        async def microphone() -> None:
            pending, spoken = b"", 0
            while True:
                if not pending and spoken < len(speech) and watch.answers > spoken:  # each after the last answer
                    pending, spoken = speech[spoken], spoken + 1
                chunk, pending = (pending[:FRAME_BYTES], pending[FRAME_BYTES:]) if pending else (
                    bytes(FRAME_BYTES), b"")
                session.push_audio(rtc.AudioFrame(data=chunk, sample_rate=ROOM_RATE, num_channels=1,
                                                  samples_per_channel=len(chunk) // 2))
                await asyncio.sleep(0.02)

        async def until_answered() -> None:
            while watch.answers < 1 + len(utterances) and not watch.errors:  # the greeting, then one per utterance
                watch.changed.clear()
                await watch.changed.wait()

        await session.update_instructions("Be brief. Use tools for dates.")
        await session.update_tools([date_after])
        mic = asyncio.create_task(microphone())
        try:
            await session.generate_reply()  # the agent greets first
            await asyncio.wait_for(until_answered(), timeout)
        finally:
            mic.cancel()
            await session.aclose()
            await model.aclose()
        return watch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8765", help="the server's base URL (http:// or ws://)")
    parser.add_argument("--model", default="sim", help="the served model name (puts LiveKit on the OpenAI lane)")
    parser.add_argument("--say", action="append", help="an utterance as simulator speech (repeatable)")
    parser.add_argument("--wav", action="append", help="an utterance from a WAV file (repeatable)")
    parser.add_argument("--out", default="out/livekit_agent.wav", help="where to write the agent's audio")
    args = parser.parse_args(argv)

    utterances = [to_48k(render_speech(s)) for s in args.say or []] + [to_48k(load_wav_16k(w)) for w in args.wav or []]
    utterances = utterances or [to_48k(render_speech(DEFAULT_SAY))]
    try:
        watch = asyncio.run(converse(args.url.rstrip("/"), args.model, utterances))
    except (TimeoutError, OSError, llm.RealtimeError) as error:
        print(f"failed: {error!r}", file=sys.stderr)
        return 1
    print("\n".join(watch.lines))
    if watch.errors:
        print(f"LiveKit reported errors: {watch.errors}", file=sys.stderr)
        return 1
    path = Path(args.out)
    write_wav(path, bytes(watch.audio), OUT_RATE)
    print(f"{len(watch.audio) / 2 / OUT_RATE:.2f} s of agent audio -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
