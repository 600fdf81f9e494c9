"""The vLLM-Omni ``DuplexClient`` session preset for Nemotron VoiceChat served by this package.

vLLM-Omni ships one ``create_duplex_session_config`` per duplex model (``vllm_omni.clients.nemotron_voicechat``,
``minicpmo_4_5``, ``personaplex``) so that ``DuplexClient`` itself stays model-neutral. This is ours, for the
tiered dialect (``/v1/realtime?duplex=1``, ``/v1/duplex``), in the same keyword-only shape as 0.30's Nemotron
preset, with these differences:

* input is PCM16 at 16 kHz (the model's own rate; nothing is resampled), ``pcm_f32le`` on request. 0.30's
  preset sends float32: both are accepted here.
* output is PCM16 at the model's native 22.05 kHz by default (no resampling; the server's default is 24 kHz),
  any rate on request (``output_sample_rate_hz``).
* tools (GA ``{type:"function",name,...}`` or the ``{type:"function",function:{...}}`` wrapper) go in
  ``extra_body["realtime_tools"]``, as 0.30 places them.
* one model position is 80 ms of input: ``DuplexClient.stream_pcm`` defaults to 200 ms chunks, so stream with
  :func:`stream_pcm16` (or pass ``chunk_ms=APPEND_MS``).
* :class:`ResumingDuplexClient` is ``DuplexClient`` that loses no input audio across a resume: what the dropped
  socket had in flight is sent again, exactly once and before anything new, from the server's input receipt; and
  its URLs carry the routing key that sends a resume to its owner behind a balancer (deploy/haproxy/README.md).

    config = create_duplex_session_config(instructions="Be brief.", tools=[WEATHER])
    async with DuplexClient(url, model=SIMULATOR_MODEL, config=config) as client:
        await stream_pcm16(client, pcm16_16k)
        await client.commit()
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np
from vllm_omni.clients.duplex import (
    AudioFormat,
    DuplexClient,
    DuplexClientBase,
    DuplexConnectionError,
    DuplexEvent,
    DuplexSessionClosedError,
    SessionConfig,
)

from ..audio.frames import INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE
from ..client.input_journal import DEFAULT_MAX_BYTES, InputGap, InputJournal, base64_size
from ..fleet.keys import PERSIST_PARAM, SESSION_ID_PARAM

__all__ = [
    "APPEND_MS",
    "MODEL",
    "SIMULATOR_MODEL",
    "ResumingDuplexClient",
    "append_bytes",
    "create_duplex_session_config",
    "stream_pcm16",
]

MODEL = "nvidia/NVIDIA-NemotronLabs-VoiceChat-11B"
SIMULATOR_MODEL = "sim"  # the model name of this package's simulator server
APPEND_MS = 80  # one model position
INPUT_ENCODINGS = ("pcm16", "pcm_f32le")
log = logging.getLogger(__name__)


def _tool_name(tool: Mapping[str, Any]) -> Any:
    inner = tool.get("function")
    return inner.get("name") if isinstance(inner, Mapping) else tool.get("name")


def create_duplex_session_config(
    *,
    instructions: str | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    output_sample_rate_hz: int = OUTPUT_SAMPLE_RATE,
    input_encoding: str = "pcm16",
    turn_detection: dict[str, Any] | None = None,
    idle_timeout_s: float | None = None,
    extra_body: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> SessionConfig:
    """A ``SessionConfig`` for voicechat: 16 kHz ``input_encoding`` in, PCM16 at ``output_sample_rate_hz`` out.

    ``turn_detection=None`` leaves turn-taking to the model (``overlap_policy`` ``listen_only``); pass
    ``{"type": "server_vad", ...}`` for speech-during-a-response barge-in. Any other ``SessionConfig`` field can
    be set through ``overrides`` (as vLLM-Omni's other presets allow).
    """
    if input_encoding not in INPUT_ENCODINGS:
        raise ValueError(f"input_encoding must be one of {INPUT_ENCODINGS}, not {input_encoding!r}")
    if isinstance(output_sample_rate_hz, bool) or not isinstance(output_sample_rate_hz, int) or output_sample_rate_hz <= 0:
        raise ValueError(f"output_sample_rate_hz must be a positive integer, not {output_sample_rate_hz!r}")
    body: dict[str, Any] = dict(extra_body or {})
    if tools is not None:
        for tool in tools:
            name = _tool_name(tool) if isinstance(tool, Mapping) else None
            if not isinstance(name, str) or not name:
                raise ValueError(f"every tool needs a function name: {tool!r}")
        body["realtime_tools"] = [dict(tool) for tool in tools]
    config = SessionConfig(
        input_audio=AudioFormat(input_encoding, INPUT_SAMPLE_RATE),
        output_audio=AudioFormat("pcm16", output_sample_rate_hz),
        instructions=instructions,
        turn_detection=turn_detection,
        idle_timeout_s=idle_timeout_s,
        extra_body=body,
    )
    return replace(config, **overrides) if overrides else config


def append_bytes(config: SessionConfig) -> int:
    """The byte size of one 80 ms append in the session's input format."""
    return config.input_audio.byte_count(APPEND_MS)


async def stream_pcm16(client: DuplexClientBase, pcm16: bytes, *, realtime: bool = True) -> None:
    """Stream 16 kHz mono PCM16 as 80 ms appends, converted to the session's input encoding.

    ``realtime`` paces one append per 80 ms (``DuplexClient.stream_pcm`` sleeps one chunk per append).
    """
    fmt = client.config.input_audio
    if fmt.sample_rate_hz != INPUT_SAMPLE_RATE:
        raise ValueError(f"the session's input rate is {fmt.sample_rate_hz} Hz; stream_pcm16 sends 16 kHz audio")
    if len(pcm16) % 2:
        raise ValueError("PCM16 audio must have an even byte count")
    if fmt.encoding == "pcm_f32le":
        pcm16 = (np.frombuffer(pcm16, dtype="<i2").astype("<f4") / 32768.0).tobytes()
    await client.stream_pcm(pcm16, chunk_ms=APPEND_MS, realtime=realtime)


class ResumingDuplexClient(DuplexClient):
    """``DuplexClient`` with input exactly-once across a resume (docs/tiered-dialect.md §6.5).

    Every audio append is journaled as it goes out. When the transport drops, an append written into it is not an
    error (it is in the journal); when the session resumes and ``session.resumed`` carries ``input_received``
    (capability ``supports_input_receipt``), the appends the session had not taken in are sent again, in order,
    before any event the application sends on the new socket. Against a server without the receipt this is
    ``DuplexClient`` unchanged. Other events keep ``DuplexClient``'s rule: a send that fails raises.
    """

    def __init__(self, url: str, *, input_journal_bytes: int = DEFAULT_MAX_BYTES, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.input_journal = InputJournal(input_journal_bytes)
        self.input_resent = 0
        """Appends sent again after resumes."""
        self.input_gaps: list[str] = []
        """Resumes after which the journal could not supply what the session lacked (raise its bound)."""
        self._settled: Any = None  # the transport whose input is settled: events go out on it at once
        self._settled_changed = asyncio.Event()

    async def _open(self) -> None:
        await super()._open()
        self._settled = self._ws

    def _target_url(self) -> str:
        """``DuplexClient``'s URL, plus the routing key a balancer in front of replicas reads at the upgrade
        (deploy/haproxy/README.md): ``persist=session_id`` always, and the session's id once it has one, so a
        resume reaches the replica that owns the session. A lone server ignores both."""
        parts = urlsplit(super()._target_url())
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        query[PERSIST_PARAM] = SESSION_ID_PARAM
        if self.session_id:
            query[SESSION_ID_PARAM] = self.session_id
        return urlunsplit(parts._replace(query=urlencode(query)))

    async def _send_command(self, payload: dict[str, object]) -> None:
        while self._ws is not self._settled and not self._closed.is_set():
            # A resume switched transports: what the old one lost goes out first (in _after_dispatch).
            self._settled_changed.clear()
            await self._settled_changed.wait()
        if self._closed.is_set():
            marker = self._closed_marker
            raise DuplexSessionClosedError(marker.reason if marker else "closed")
        if self._ws is None:
            raise DuplexConnectionError("send failed: transport is not connected")
        text = json.dumps(payload)
        audio = payload.get("audio")
        append = payload.get("type") == "input_audio_buffer.append" and isinstance(audio, str)
        if append:
            event_id = payload.get("event_id")
            self.input_journal.record(event_id if isinstance(event_id, str) else None, base64_size(audio), text)
        try:
            await self._ws.send(text)
        except asyncio.CancelledError:
            raise
        except Exception:
            if append and self.resume_token and self._reconnect is not None:
                return  # journaled: sent again once the session has resumed
            raise

    async def _after_dispatch(self, event: DuplexEvent, data: dict[str, object]) -> None:
        if event.type == "session.resumed":
            await self._resend(data.get("input_received"))
        await super()._after_dispatch(event, data)

    def _finalize(self, reason: str, *, expected: bool) -> None:
        super()._finalize(reason, expected=expected)
        self._settled_changed.set()  # waiting sends raise

    async def _resend(self, receipt: object) -> None:
        ws = self._ws
        try:
            if isinstance(receipt, Mapping):
                try:
                    again = self.input_journal.unreceived(receipt)
                except InputGap as exc:
                    self.input_gaps.append(str(exc))
                    log.warning("input audio lost across a resume: %s", exc)
                    again = []
                for entry in again:
                    await ws.send(entry.text)
                self.input_resent += len(again)
        except Exception:  # the new transport failed too: the next resume's receipt says what to send
            log.debug("resending input after a resume failed", exc_info=True)
        finally:
            self._settled = ws
            self._settled_changed.set()
