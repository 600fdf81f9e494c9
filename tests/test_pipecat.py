"""Pipecat's own OpenAI Realtime client (pipecat-ai[openai] 1.14.0, ``OpenAIRealtimeLLMService``), unmodified, in a
pipeline as its examples build one, against the simulator server's OpenAI lane (/v1/realtime).

Every flow asserts on what Pipecat reports (its frames: TTS started/audio/text, transcriptions, function calls,
errors) and that the server sent no error event the flow did not ask for. Skipped where Pipecat is not installed
(CI runs it in a venv of its own: ``pip install -e '.[test,pipecat]'``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("pipecat.services.openai.realtime.llm", reason="pipecat-ai[openai] is not installed")

from pipecat.adapters.schemas.function_schema import FunctionSchema  # noqa: E402
from pipecat.adapters.schemas.tools_schema import ToolsSchema  # noqa: E402
from pipecat.frames.frames import (  # noqa: E402
    EndFrame,
    ErrorFrame,
    Frame,
    FunctionCallResultFrame,
    InputAudioRawFrame,
    LLMRunFrame,
    ProposedUserStartedSpeakingFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.runner import PipelineRunner  # noqa: E402
from pipecat.pipeline.worker import PipelineParams, PipelineWorker  # noqa: E402
from pipecat.processors.aggregators.llm_context import LLMContext  # noqa: E402
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.services.llm_service import FunctionCallParams  # noqa: E402
from pipecat.services.openai.realtime import events  # noqa: E402
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService  # noqa: E402

from .framework_flows import (  # noqa: E402
    LONG_UTTERANCE,
    MODEL,
    WEATHER_CALL,
    WEATHER_RESULT,
    WEATHER_TOOL,
    Microphone,
    simulator_server,
    until,
)

RATE = 24_000  # Pipecat's realtime service sends and receives 24 kHz
WAIT_S = 60.0  # a flow's bound: it ends at an awaited condition long before, on any machine

TURN_DETECTION: dict[str, Any] = {
    "default": None,  # nothing sent: the lane's default, semantic_vad (Pipecat's own default)
    "semantic_vad": events.SemanticTurnDetection(interrupt_response=True),
    "server_vad": events.TurnDetection(),
}


@pytest.fixture(scope="module")
def server():
    with simulator_server() as running:
        yield running


class Tap(FrameProcessor):
    """Records every frame that passes, both ways (audio input left out), and wakes who waits on one."""

    def __init__(self, bot: Bot) -> None:
        super().__init__()
        self.bot = bot

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if not isinstance(frame, InputAudioRawFrame):
            self.bot.saw(frame)
        await self.push_frame(frame, direction)


class Bot:
    """One Pipecat pipeline (user aggregator, the realtime service, assistant aggregator) with a microphone that
    streams 24 kHz frames as a transport does: silence, and speech when the flow says."""

    def __init__(self, url: str, *, turn_detection: str = "default", messages: list | None = None,
                 tools: bool = False) -> None:
        properties = events.SessionProperties()
        if TURN_DETECTION[turn_detection] is not None:
            properties = events.SessionProperties(audio=events.AudioConfiguration(
                input=events.AudioInput(turn_detection=TURN_DETECTION[turn_detection])))
        self.llm = OpenAIRealtimeLLMService(api_key="unused", base_url=f"{url}/v1/realtime",
                                            settings=OpenAIRealtimeLLMService.Settings(
                                                model=MODEL, system_instruction="Be brief.",
                                                session_properties=properties))
        self.calls: list[dict] = []
        schema = None
        if tools:
            schema = ToolsSchema(standard_tools=[FunctionSchema(
                name=WEATHER_TOOL["name"], description=WEATHER_TOOL["description"],
                properties=WEATHER_TOOL["parameters"]["properties"], required=WEATHER_TOOL["parameters"]["required"])])
            self.llm.register_function("get_weather", self._get_weather)
        context = LLMContext(messages or [], tools=schema) if schema else LLMContext(messages or [])
        pair = LLMContextAggregatorPair(context)
        self.frames: list[Frame] = []
        self._seen = asyncio.Event()
        self.worker = PipelineWorker(Pipeline([pair.user(), Tap(self), self.llm, Tap(self), pair.assistant()]),
                                     params=PipelineParams(audio_in_sample_rate=RATE), idle_timeout_secs=None,
                                     enable_rtvi=False)
        self.microphone = Microphone(RATE)

    async def _get_weather(self, params: FunctionCallParams) -> None:
        self.calls.append(dict(params.arguments))
        await params.result_callback(json.loads(WEATHER_RESULT))

    def saw(self, frame: Frame) -> None:
        if any(f is frame for f in self.frames[-8:]):
            return  # the second tap sees what passed the first
        self.frames.append(frame)
        self._seen.set()

    async def until(self, predicate) -> None:
        await until(predicate, self._seen, WAIT_S)

    async def greeted(self) -> None:
        """What Pipecat's examples do as a client connects: LLMRunFrame over a context with no user message (the
        first context sets the conversation up; a later one is answered by the model's own turn taking)."""
        await self.worker.queue_frames([LLMRunFrame()])
        await self.until(lambda: self.spoke("Hello! How can I help?"))

    def say(self, text: str) -> None:
        self.microphone.say(text)

    async def run(self, flow) -> None:
        """Runs the pipeline and the microphone while ``flow(self)`` runs; ends the pipeline after it."""
        runner = asyncio.create_task(PipelineRunner(handle_sigint=False).run(self.worker))
        mic = asyncio.create_task(self.microphone.run(
            lambda chunk: self.worker.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=RATE, num_channels=1))))
        try:
            await flow(self)
        finally:
            mic.cancel()
            await self.worker.queue_frame(EndFrame())
            await asyncio.wait_for(runner, WAIT_S)

    # What Pipecat reported.
    def of(self, kind: type) -> list:
        return [f for f in self.frames if isinstance(f, kind)]

    def spoken(self, frames: list[Frame] | None = None) -> str:
        """The bot's words as Pipecat's TTS text frames carry them."""
        return "".join(f.text for f in (self.frames if frames is None else frames) if isinstance(f, TTSTextFrame))

    def heard(self) -> list[str]:
        return [f.text for f in self.of(TranscriptionFrame)]

    def spoke(self, text: str) -> bool:
        return text in self.spoken()


def started(frames: list[Frame]) -> list[int]:
    """Where the server's speech_started reached Pipecat (its ProposedUserStartedSpeakingFrame)."""
    return [i for i, f in enumerate(frames) if isinstance(f, ProposedUserStartedSpeakingFrame)]


def run(url: str, flow, **options: Any) -> Bot:
    bot = Bot(url, **options)
    asyncio.run(bot.run(flow))
    assert bot.of(ErrorFrame) == []
    return bot


def test_typed_turn(server):
    url, errors = server
    before = len(errors.sent)

    async def flow(bot: Bot) -> None:
        await bot.worker.queue_frames([LLMRunFrame()])
        await bot.until(lambda: bot.spoke("You said: Good morning."))

    bot = run(url, flow, messages=[{"role": "user", "content": "Good morning"}])
    assert bot.spoken() == "You said: Good morning."
    assert len(bot.of(TTSStartedFrame)) == 1 and bot.of(TTSAudioRawFrame)
    assert errors.sent[before:] == []


def test_greeting_then_a_spoken_turn(server):
    """What Pipecat's examples do first: LLMRunFrame over a context with no user message (the bot greets)."""
    url, errors = server
    before = len(errors.sent)

    async def flow(bot: Bot) -> None:
        await bot.greeted()
        bot.say("hello there")
        await bot.until(lambda: bot.spoke("You said: hello there."))

    bot = run(url, flow)
    assert bot.spoken() == "Hello! How can I help?You said: hello there."
    assert bot.heard() == ["hello there"]
    assert all(f.sample_rate == RATE for f in bot.of(TTSAudioRawFrame))
    assert errors.sent[before:] == []


@pytest.mark.parametrize("turn_detection", ["default", "semantic_vad", "server_vad"])
def test_the_user_interrupts_the_bot(server, turn_detection):
    """The user speaks while the bot answers: Pipecat truncates at speech_started and plays whatever comes next, so
    nothing of the old answer may follow it; the new answer is the only audio after it."""
    url, errors = server
    before = len(errors.sent)
    mark: list[int] = []

    async def flow(bot: Bot) -> None:
        await bot.greeted()
        bot.say(LONG_UTTERANCE)
        await bot.until(lambda: bot.spoke("You said: please tell"))
        said = len(bot.frames)
        bot.say("stop")
        await bot.until(lambda: started(bot.frames[said:]))
        mark.append(said + started(bot.frames[said:])[0])
        await bot.until(lambda: bot.spoke("You said: stop."))

    bot = run(url, flow, turn_detection=turn_detection)
    after = bot.frames[mark[0]:]
    assert bot.spoken(after) == "You said: stop."  # nothing of the old answer after the user's speech started
    assert len([f for f in after if isinstance(f, TTSStartedFrame)]) == 1
    assert not bot.spoke(LONG_UTTERANCE + ".")  # the long answer was cut
    assert bot.heard() == [LONG_UTTERANCE, "stop"]
    assert errors.sent[before:] == []


def test_function_call_round_trip(server):
    """Pipecat's tool API: the registered handler runs with the model's arguments, its result goes back as a
    function_call_output, and the bot speaks the result; no message of silence ahead of the call."""
    url, errors = server
    before = len(errors.sent)

    async def flow(bot: Bot) -> None:
        await bot.greeted()
        bot.say(WEATHER_CALL)
        await bot.until(lambda: bot.spoke("The result is"))
        await bot.until(lambda: bot.spoke(WEATHER_RESULT) or bot.spoke("21"))

    bot = run(url, flow, tools=True)
    assert bot.calls == [{"city": "Paris"}]
    results = {f.tool_call_id: f.result for f in bot.of(FunctionCallResultFrame)}  # broadcast: a frame each way
    assert list(results.values()) == [json.loads(WEATHER_RESULT)]
    assert bot.spoken().startswith("Hello! How can I help?The result is")  # no words ahead of the call
    assert len(bot.of(TTSStartedFrame)) == 2  # the greeting, then the result: no audio ahead of the call
    assert errors.sent[before:] == []


def test_the_example_greets_calls_the_local_tool_and_speaks_its_result(server, tmp_path, capsys):
    from .test_examples import load_example

    url, errors = server
    before = len(errors.sent)
    out = tmp_path / "bot.wav"
    assert load_example("pipecat_realtime").main(["--url", url, "--say", "hello there", "--say",
                                                  'call date_after {"start": "2026-11-30", "days": 30}',
                                                  "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:5] == [
        "assistant: Hello! How can I help?",
        "user: hello there",
        "assistant: You said: hello there.",
        'user: call date_after {"start": "2026-11-30", "days": 30}',
        "tool date_after({\"days\": 30, \"start\": \"2026-11-30\"}) -> '2026-12-30, a Wednesday'",
    ]
    assert lines[5] == "assistant: The result is 2026-12-30, a Wednesday." and len(lines) == 7
    assert lines[6].endswith(f"s of bot audio -> {out}")
    assert errors.sent[before:] == []
