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

    config = create_duplex_session_config(instructions="Be brief.", tools=[WEATHER])
    async with DuplexClient(url, model=SIMULATOR_MODEL, config=config) as client:
        await stream_pcm16(client, pcm16_16k)
        await client.commit()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from vllm_omni.clients.duplex import AudioFormat, DuplexClientBase, SessionConfig

from ..audio.frames import INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE

__all__ = [
    "APPEND_MS",
    "MODEL",
    "SIMULATOR_MODEL",
    "append_bytes",
    "create_duplex_session_config",
    "stream_pcm16",
]

MODEL = "nvidia/NVIDIA-NemotronLabs-VoiceChat-11B"
SIMULATOR_MODEL = "sim"  # the model name of this package's simulator server
APPEND_MS = 80  # one model position
INPUT_ENCODINGS = ("pcm16", "pcm_f32le")


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
