"""LiveKit Agents' own OpenAI Realtime client (livekit-agents + livekit-plugins-openai 1.8.9: ``RealtimeModel``'s
``RealtimeSession``), unmodified and without a room, against the simulator server's OpenAI lane (/v1/realtime).

Every flow asserts on what LiveKit reports (its generations with their text, audio and function streams, its speech
and transcription events, its errors) and that the server sent no error event the flow did not ask for. The
microphone is a 48 kHz room track's frames, pushed as LiveKit's agent pushes them (it resamples to 24 kHz itself).
Skipped where LiveKit is not installed (CI runs it in a venv of its own: ``pip install -e '.[test,livekit]'``).
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("livekit.plugins.openai.realtime", reason="livekit-plugins-openai is not installed")

import aiohttp  # noqa: E402
from livekit import rtc  # noqa: E402
from livekit.agents import APIConnectOptions, llm  # noqa: E402
from livekit.plugins.openai.realtime import RealtimeModel  # noqa: E402
from openai.types.realtime.realtime_audio_input_turn_detection import SemanticVad, ServerVad  # noqa: E402

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

RATE = 48_000  # a room's track; LiveKit resamples to the 24 kHz it sends
WAIT_S = 60.0  # a flow's bound: it ends at an awaited condition long before, on any machine

TURN_DETECTION: dict[str, Any] = {
    "semantic_vad": SemanticVad(type="semantic_vad", create_response=True, eagerness="medium",
                                interrupt_response=True),  # LiveKit's default, spelled out
    "server_vad": ServerVad(type="server_vad", create_response=True, interrupt_response=True),
}


@pytest.fixture(scope="module")
def server():
    os.environ.pop("OPENAI_API_VERSION", None)  # LiveKit reads it as Azure mode
    with simulator_server() as running:
        yield running


@dataclass
class Generation:
    """One LiveKit generation as its streams delivered it."""

    event: llm.GenerationCreatedEvent
    text: list[str] = field(default_factory=list)
    audio_frames: list[rtc.AudioFrame] = field(default_factory=list)
    calls: list[llm.FunctionCall] = field(default_factory=list)
    done: bool = False

    @property
    def spoken(self) -> str:
        return "".join(self.text)


class Agent:
    """One LiveKit RealtimeSession, its events, and a 48 kHz microphone: silence, and speech when the flow says."""

    def __init__(self, url: str, http: aiohttp.ClientSession, turn_detection: str = "semantic_vad") -> None:
        self.model = RealtimeModel(model=MODEL, api_key="unused", base_url=url.replace("ws://", "http://") + "/v1",
                                   http_session=http, turn_detection=TURN_DETECTION[turn_detection],
                                   max_session_duration=None, conn_options=APIConnectOptions(max_retry=0))
        self.session = self.model.session()
        self.generations: list[Generation] = []
        self.errors: list[Any] = []
        self.speech_started = 0
        self.transcripts: list[str] = []
        self.server_events: list[dict] = []
        self._tasks: list[asyncio.Task] = []
        self._changed = asyncio.Event()
        self.microphone = Microphone(RATE)
        s = self.session
        s.on("generation_created", self._on_generation)
        s.on("error", lambda e: self._note(self.errors.append(e)))
        s.on("input_speech_started", lambda _: self._note(self._count_speech()))
        s.on("input_audio_transcription_completed",
             lambda e: self._note(self.transcripts.append(e.transcript) if e.is_final else None))
        s.on("openai_server_event_received", lambda e: self.server_events.append(e))
        self._tasks.append(asyncio.create_task(self.microphone.run(
            lambda chunk: s.push_audio(rtc.AudioFrame(data=chunk, sample_rate=RATE, num_channels=1,
                                                      samples_per_channel=len(chunk) // 2)))))

    def _count_speech(self) -> None:
        self.speech_started += 1

    def _note(self, _: object = None) -> None:
        self._changed.set()

    def _on_generation(self, event: llm.GenerationCreatedEvent) -> None:
        g = Generation(event)
        self.generations.append(g)
        self._tasks.append(asyncio.create_task(self._read(g)))
        self._note()

    async def _read(self, g: Generation) -> None:
        async def message(msg: llm.MessageGeneration) -> None:
            async def text() -> None:
                async for chunk in msg.text_stream:
                    g.text.append(str(chunk))
                    self._note()

            async def audio() -> None:
                async for frame in msg.audio_stream:
                    g.audio_frames.append(frame)

            await asyncio.gather(text(), audio())

        async def messages() -> None:
            readers = [asyncio.create_task(message(m)) async for m in g.event.message_stream]  # each as it comes
            await asyncio.gather(*readers)

        async def calls() -> None:
            async for call in g.event.function_stream:
                g.calls.append(call)
                self._note()

        await asyncio.gather(messages(), calls())
        g.done = True
        self._note()

    async def until(self, predicate) -> None:
        await until(predicate, self._changed, WAIT_S)

    def say(self, text: str) -> None:
        self.microphone.say(text)

    def said(self, text: str) -> Generation | None:
        return next((g for g in self.generations if text in g.spoken), None)

    async def aclose(self) -> None:
        for t in self._tasks:
            t.cancel()
        await self.session.aclose()
        await self.model.aclose()


async def with_agent(url: str, flow, **options: Any) -> Agent:
    async with aiohttp.ClientSession() as http:
        agent = Agent(url, http, **options)
        try:
            await flow(agent)
        finally:
            await agent.aclose()
    return agent


def run(url: str, flow, **options: Any) -> Agent:
    agent = asyncio.run(with_agent(url, flow, **options))
    assert agent.errors == []
    return agent


def test_typed_turn_through_generate_reply(server):
    """A user message in the chat context, then generate_reply(): its future resolves to the generation (LiveKit
    matches it by the metadata the server echoes), which speaks the answer."""
    url, errors = server
    before = len(errors.sent)
    got: list[llm.GenerationCreatedEvent] = []

    async def flow(agent: Agent) -> None:
        ctx = agent.session.chat_ctx.copy()
        ctx.add_message(role="user", content="Good morning")
        await agent.session.update_chat_ctx(ctx)
        got.append(await agent.session.generate_reply())
        await agent.until(lambda: bool(agent.generations) and agent.generations[-1].done)

    agent = run(url, flow)
    [g] = agent.generations
    assert got[0] is g.event and g.event.user_initiated
    assert g.spoken == "You said: Good morning." and g.audio_frames
    assert {f.sample_rate for f in g.audio_frames} == {24_000}
    assert errors.sent[before:] == []


def test_greeting_and_generate_reply_with_instructions(server):
    """What LiveKit's agents do to greet: generate_reply() over an empty conversation (the model speaks first), and
    generate_reply(instructions=...) (the session's instructions, a newline and the text: the model hears the text,
    its own instructions being fixed once it started)."""
    url, errors = server
    before = len(errors.sent)

    async def flow(agent: Agent) -> None:
        await agent.session.update_instructions("Be brief.")
        first = await agent.session.generate_reply()
        await agent.until(lambda: agent.generations[-1].done)
        second = await agent.session.generate_reply(instructions="Greet Ada")
        await agent.until(lambda: agent.generations[-1].done)
        assert [g.event for g in agent.generations] == [first, second]

    agent = run(url, flow)
    assert [g.spoken for g in agent.generations] == ["Hello! How can I help?", "You said: Greet Ada."]
    assert all(g.event.user_initiated and g.audio_frames for g in agent.generations)
    assert errors.sent[before:] == []


def test_spoken_turn_at_48k(server):
    url, errors = server
    before = len(errors.sent)

    async def flow(agent: Agent) -> None:
        agent.say("hello there")
        await agent.until(lambda: (g := agent.said("You said: hello there.")) is not None and g.done)

    agent = run(url, flow)
    [g] = agent.generations
    assert g.spoken == "You said: hello there." and not g.event.user_initiated
    assert agent.transcripts == ["hello there"] and agent.speech_started == 1
    assert errors.sent[before:] == []


@pytest.mark.parametrize("turn_detection", ["semantic_vad", "server_vad"])
def test_the_user_interrupts_the_agent(server, turn_detection):
    """The user speaks while the agent answers: the server ends that response at speech start (interrupt_response),
    so its generation closes cut short and nothing of it comes after speech_started; the new turn is answered."""
    url, errors = server
    before = len(errors.sent)

    async def flow(agent: Agent) -> None:
        agent.say(LONG_UTTERANCE)
        await agent.until(lambda: agent.said("You said: please tell") is not None)
        agent.say("stop")
        await agent.until(lambda: (g := agent.said("You said: stop.")) is not None and g.done)

    agent = run(url, flow, turn_detection=turn_detection)
    first, second = agent.generations
    assert first.done and first.spoken.startswith("You said: please tell")
    assert not first.spoken.endswith("north.")  # cut short
    assert second.spoken == "You said: stop."
    assert agent.transcripts == [LONG_UTTERANCE, "stop"]
    types = [(e["type"], e.get("response_id")) for e in agent.server_events]
    cut = [i for i, t in enumerate(types) if t[0] == "input_audio_buffer.speech_started"][1]  # the "stop"
    cut_id = first.event.response_id
    assert ("response.output_audio.delta", cut_id) not in types[cut:]  # nothing of it after the user's speech
    done = [e for e in agent.server_events if e["type"] == "response.done" and e["response"]["id"] == cut_id]
    assert done[0]["response"]["status"] == "cancelled"
    assert errors.sent[before:] == []


def test_function_call_round_trip(server):
    """LiveKit's tool API as its agent drives it: the call comes on the generation's function stream; the output
    goes back through update_chat_ctx (call ids within 32 characters: LiveKit would hash a longer one), then
    generate_reply(tool_choice="auto"); the answer speaks the result. No message of silence ahead of the call."""
    url, errors = server
    before = len(errors.sent)
    replies: list[llm.GenerationCreatedEvent] = []

    @llm.function_tool(raw_schema={"type": "function", **WEATHER_TOOL})
    async def get_weather(raw_arguments: dict[str, object]) -> str:
        return WEATHER_RESULT

    async def flow(agent: Agent) -> None:
        await agent.session.update_tools([get_weather])
        agent.say(WEATHER_CALL)
        await agent.until(lambda: bool(agent.generations) and agent.generations[0].done)
        [call] = agent.generations[0].calls
        ctx = agent.session.chat_ctx.copy()
        ctx.items.append(llm.FunctionCallOutput(call_id=call.call_id, name=call.name, output=WEATHER_RESULT,
                                                is_error=False))
        await agent.session.update_chat_ctx(ctx)
        replies.append(await agent.session.generate_reply(tool_choice="auto"))
        await agent.until(lambda: (g := agent.said("The result is")) is not None and g.done)

    agent = run(url, flow)
    first, second = agent.generations
    [call] = first.calls
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert len(call.call_id) <= 32
    assert first.text == [] and first.audio_frames == []  # the call alone: no message of silence before it
    assert replies == [second.event]
    assert second.spoken.startswith("The result is")
    assert errors.sent[before:] == []


def test_the_example_greets_calls_the_local_tool_and_speaks_its_result(server, tmp_path, capsys):
    from .test_examples import load_example

    url, errors = server
    before = len(errors.sent)
    out = tmp_path / "agent.wav"
    assert load_example("livekit_realtime").main(["--url", url.replace("ws://", "http://"), "--say", "hello there",
                                                  "--say", 'call date_after {"start": "2026-11-30", "days": 30}',
                                                  "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:6] == [
        "assistant: Hello! How can I help?",
        "user: hello there",
        "assistant: You said: hello there.",
        'user: call date_after {"start": "2026-11-30", "days": 30}',
        "tool date_after({\"days\": 30, \"start\": \"2026-11-30\"}) -> '2026-12-30, a Wednesday'",
        "assistant: The result is 2026-12-30, a Wednesday.",
    ]
    assert lines[6].endswith(f"s of agent audio -> {out}") and len(lines) == 7
    assert errors.sent[before:] == []
