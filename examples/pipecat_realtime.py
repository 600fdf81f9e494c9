"""Pipecat's OpenAI Realtime service (``OpenAIRealtimeLLMService``), unmodified, against this server's
OpenAI-compatible lane (``/v1/realtime?model=...``), in a pipeline with a local function tool.

The pipeline is Pipecat's usual one (user aggregator, the realtime service, assistant aggregator) with a
microphone of our own in place of a transport: it streams 24 kHz PCM16 (the rate Pipecat's realtime service
sends) in 20 ms frames, silence between utterances, as a transport would. The bot greets first (``LLMRunFrame``
over a context with no user message, as Pipecat's examples start), then each ``--say`` utterance is spoken and
answered by the model's own end of turn (the lane's default ``semantic_vad``). Against the simulator, utterances
are rendered as simulator speech and ``call NAME {json}`` makes it call a tool; against a real model use
``--wav``. Prints the conversation as Pipecat reports it and writes the bot's audio to one 24 kHz WAV.

Needs ``pip install 'pipecat-ai[openai]==1.14.0'`` (a venv of its own keeps its pins apart).

    vllm-omni-voicechat serve --port 8765 &
    python examples/pipecat_realtime.py --url ws://127.0.0.1:8765
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import soxr
from pipecat.adapters.schemas.function_schema import FunctionSchema
from pipecat.adapters.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    LLMContextAssistantTurnFrame,
    LLMRunFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.audio.wav import load_wav_16k, write_wav

RATE = 24_000  # Pipecat's realtime service: 24 kHz PCM16 both ways
FRAME_BYTES = 2 * RATE // 50  # 20 ms
DEFAULT_SAY = 'call date_after {"start": "2026-11-30", "days": 30}'
DATE_AFTER = FunctionSchema(
    name="date_after",
    description="The date a number of days after a start date (ISO format, e.g. 2026-11-30), with its weekday.",
    properties={"start": {"type": "string"}, "days": {"type": "integer"}},
    required=["start", "days"],
)


def date_after(start: str, days: int) -> str:
    try:
        end = date.fromisoformat(start) + timedelta(days=int(days))
    except ValueError as error:
        return f"cannot compute that: {error}"
    return f"{end.isoformat()}, a {end:%A}"


def to_24k(pcm16_16k: bytes) -> bytes:
    samples = np.frombuffer(pcm16_16k, dtype="<i2")
    return soxr.resample(samples, 16_000, RATE).astype("<i2").tobytes()


class Conversation:
    """What Pipecat reports: the user's transcripts (they travel upstream from the service), the bot's turns and
    audio (downstream of it), errors; ``tap(side)`` is the processor that watches one side of the service."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.audio = bytearray()
        self.errors: list[str] = []
        self.changed = asyncio.Event()

    def tap(self, side: str) -> FrameProcessor:
        return _Tap(self, side)

    def saw(self, frame: Frame, side: str) -> None:
        if side == "in" and isinstance(frame, TranscriptionFrame):
            self.lines.append(f"user: {frame.text}")
        elif side == "in" and isinstance(frame, ErrorFrame):
            self.errors.append(frame.error)
        elif side == "out" and isinstance(frame, LLMContextAssistantTurnFrame) and frame.text:
            self.lines.append(f"assistant: {frame.text}")
        elif side == "out" and isinstance(frame, TTSAudioRawFrame):
            self.audio += frame.audio
        self.changed.set()

    def answers(self) -> int:
        return sum(line.startswith("assistant: ") for line in self.lines)


class _Tap(FrameProcessor):
    def __init__(self, conversation: Conversation, side: str) -> None:
        super().__init__()
        self.conversation, self.side = conversation, side

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.conversation.saw(frame, self.side)
        await self.push_frame(frame, direction)


async def converse(url: str, model: str, utterances: list[bytes], timeout: float = 60.0) -> Conversation:
    llm = OpenAIRealtimeLLMService(api_key="unused", base_url=f"{url}/v1/realtime",  # the local server needs no key
                                   settings=OpenAIRealtimeLLMService.Settings(
                                       model=model, system_instruction="Be brief. Use tools for dates."))

    async def on_date_after(params: FunctionCallParams) -> None:
        result = date_after(**params.arguments)
        watch.lines.append(f"tool date_after({json.dumps(dict(params.arguments), sort_keys=True)}) -> {result!r}")
        await params.result_callback(result)

    llm.register_function("date_after", on_date_after)
    pair = LLMContextAggregatorPair(LLMContext([], tools=ToolsSchema(standard_tools=[DATE_AFTER])))
    watch = Conversation()
    worker = PipelineWorker(Pipeline([pair.user(), watch.tap("in"), llm, watch.tap("out"), pair.assistant()]),
                            params=PipelineParams(audio_in_sample_rate=RATE), idle_timeout_secs=None,
                            enable_rtvi=False)
    speech = [pcm + bytes(2 * RATE) for pcm in utterances]  # a second of silence: the model ends the turn

    async def until(predicate) -> None:
        async def wait() -> None:
            while not predicate() and not watch.errors:
                watch.changed.clear()
                await watch.changed.wait()

        await asyncio.wait_for(wait(), timeout)

    async def microphone() -> None:
        pending, spoken = b"", 0
        while True:
            if not pending and spoken < len(speech) and watch.answers() > spoken:  # each after the last answer
                pending, spoken = speech[spoken], spoken + 1
            chunk, pending = (pending[:FRAME_BYTES], pending[FRAME_BYTES:]) if pending else (bytes(FRAME_BYTES), b"")
            await worker.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=RATE, num_channels=1))
            await asyncio.sleep(0.02)

    async def conversation() -> None:
        mic = asyncio.create_task(microphone())
        try:
            await worker.queue_frames([LLMRunFrame()])  # the bot greets first
            await until(lambda: watch.answers() >= 1 + len(utterances))  # the greeting, then one per utterance
        finally:
            mic.cancel()
            await worker.queue_frame(EndFrame())

    await asyncio.gather(PipelineRunner(handle_sigint=False).run(worker), conversation())
    return watch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8765", help="the server's base URL (ws://)")
    parser.add_argument("--model", default="sim", help="the served model name (puts Pipecat on the OpenAI lane)")
    parser.add_argument("--say", action="append", help="an utterance as simulator speech (repeatable)")
    parser.add_argument("--wav", action="append", help="an utterance from a WAV file (repeatable)")
    parser.add_argument("--out", default="out/pipecat_bot.wav", help="where to write the bot's audio")
    args = parser.parse_args(argv)

    utterances = [to_24k(render_speech(s)) for s in args.say or []] + [to_24k(load_wav_16k(w)) for w in args.wav or []]
    utterances = utterances or [to_24k(render_speech(DEFAULT_SAY))]
    try:
        watch = asyncio.run(converse(args.url.rstrip("/"), args.model, utterances))
    except (TimeoutError, OSError) as error:
        print(f"failed: {error!r}", file=sys.stderr)
        return 1
    print("\n".join(watch.lines))
    if watch.errors:
        print(f"Pipecat reported errors: {watch.errors}", file=sys.stderr)
        return 1
    path = Path(args.out)
    write_wav(path, bytes(watch.audio), RATE)
    print(f"{len(watch.audio) / 2 / RATE:.2f} s of bot audio -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
