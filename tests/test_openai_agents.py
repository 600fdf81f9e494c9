"""The openai-agents SDK's realtime session (pinned 0.24.0) over the OpenAI-compatible lane, on the simulator.

Skipped where openai-agents is not installed (it pins websockets<17, so CI runs it in its own venv).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import soxr

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.server import ServerConfig

from .compat import validate_openai_server_event
from .server_fixture import running_app

realtime = pytest.importorskip("agents.realtime", reason="openai-agents is not installed")
agents = pytest.importorskip("agents")

SILENCE_1S_24K = bytes(2 * 24_000)


def speech_24k(text: str) -> bytes:
    pcm16 = np.frombuffer(render_speech(text), dtype="<i2")
    return soxr.resample(pcm16, 16_000, 24_000).astype("<i2").tobytes()


@agents.function_tool
def get_weather(city: str) -> str:
    """Weather for a city."""
    return f'{{"city": "{city}", "temp_c": 21}}'


async def converse(url: str, utterances: list[str], *, turn_detection: dict | None, until: str) -> list:
    agent = realtime.RealtimeAgent(name="assistant", instructions="Be brief.", tools=[get_weather])
    settings: dict = {}
    if turn_detection is not None:
        settings["turn_detection"] = turn_detection
    runner = realtime.RealtimeRunner(agent, config={"model_settings": settings} if settings else None)
    session = await runner.run(model_config={"url": f"{url}/v1/realtime?model=sim", "headers": {}})
    events: list = []
    async with session:
        async def consume() -> None:
            async for event in session:
                events.append(event)
                if event.type == "history_updated" and any(until in _text(i) for i in event.history):
                    return

        consumer = asyncio.create_task(consume())
        for text in utterances:
            pcm = speech_24k(text) + SILENCE_1S_24K
            for i in range(0, len(pcm), 4800):  # 100 ms chunks
                await session.send_audio(pcm[i : i + 4800])
        await asyncio.wait_for(consumer, 30)
    return events


def _text(item) -> str:
    content = getattr(item, "content", None) or []
    return " ".join(str(getattr(c, "transcript", None) or getattr(c, "text", None) or "") for c in content)


def _raw_server_events(events: list) -> list[dict]:
    return [e.data.data for e in events
            if e.type == "raw_model_event" and getattr(e.data, "type", None) == "raw_server_event"]


@pytest.fixture(scope="module")
def url():
    with running_app(ServerConfig.simulator(max_sessions=2)) as (base, _):
        yield base


@pytest.mark.parametrize("turn_detection", [None, {"type": "server_vad", "interrupt_response": True}],
                         ids=["semantic_vad_default", "server_vad"])
def test_conversation_without_errors(url, turn_detection):
    events = asyncio.run(converse(url, ["hello there"], turn_detection=turn_detection, until="You said: hello there."))
    errors = [e for e in events if e.type == "error"]
    assert errors == []
    assert any(e.type == "audio" for e in events)
    raw = _raw_server_events(events)
    assert raw and all(validate_openai_server_event(r) for r in raw)


def test_function_tool_round_trip(url):
    events = asyncio.run(converse(url, ['call get_weather {"city": "Paris"}'], turn_detection=None,
                                  until="The result is"))
    assert [e for e in events if e.type == "error"] == []
    assert [e.tool.name for e in events if e.type == "tool_start"] == ["get_weather"]
    assert [e.output for e in events if e.type == "tool_end"] == ['{"city": "Paris", "temp_c": 21}']
    raw = _raw_server_events(events)
    assert all(validate_openai_server_event(r) for r in raw)


# ============================================================================ manual turns (turn_detection null)
#
# The push-to-talk flows of docs/tiered-dialect.md §13 through the agents SDK: ``send_audio(..., commit=True)``
# seals the turn and a raw ``response.create`` (the SDK's documented way with turn detection off) answers it.


class ManualSession:
    """One agents realtime session with turn detection off; every session event it yielded."""

    def __init__(self, session) -> None:
        self.session = session
        self.events: list = []
        self._queue: asyncio.Queue = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for event in self.session:
            self.events.append(event)
            await self._queue.put(event)

    async def until(self, predicate) -> list:
        """Session events until one satisfies ``predicate`` (that one included)."""
        async def loop() -> list:
            got = []
            while True:
                event = await self._queue.get()
                got.append(event)
                if predicate(event):
                    return got

        return await asyncio.wait_for(loop(), 30)

    async def reply(self, text: str) -> list:
        """Until the history shows ``text``, then until every response created so far is done (the transcript can
        reach the history a few events before its response.done: a flow must not end in between)."""
        got = await self.until(lambda e: e.type == "history_updated" and any(text in _text(i) for i in e.history))

        def all_done(_: object = None) -> bool:
            types = self.raw_types()
            return types.count("response.done") >= types.count("response.created")

        if not all_done():
            got += await self.until(all_done)
        return got

    async def raw(self, message: dict) -> None:
        from agents.realtime.model_inputs import RealtimeModelSendRawMessage

        await self.session.model.send_event(RealtimeModelSendRawMessage(message=message))  # type: ignore[arg-type]

    async def push_to_talk(self, text: str) -> None:
        pcm = speech_24k(text)
        chunks = [pcm[i : i + 4800] for i in range(0, len(pcm), 4800)]  # 100 ms each
        for chunk in chunks[:-1]:
            await self.session.send_audio(chunk)
        await self.session.send_audio(chunks[-1], commit=True)  # append + input_audio_buffer.commit
        await self.raw({"type": "response.create"})

    def raw_types(self) -> list[str]:
        return [r["type"] for r in _raw_server_events(self.events)]

    def errors(self) -> list:
        return [e for e in self.events if e.type == "error"]


async def manual_session(url: str, flow) -> ManualSession:
    agent = realtime.RealtimeAgent(name="assistant", instructions="Be brief.", tools=[get_weather])
    runner = realtime.RealtimeRunner(agent, config={"model_settings": {"turn_detection": None}})
    session = await runner.run(model_config={"url": f"{url}/v1/realtime?model=sim", "headers": {}})
    async with session:
        s = ManualSession(session)
        await s.until(lambda e: e.type == "raw_model_event" and getattr(e.data, "type", None) == "raw_server_event"
                      and e.data.data.get("type") == "session.updated")
        try:
            await flow(s)
        finally:
            s._reader.cancel()
    raw = _raw_server_events(s.events)
    assert all(validate_openai_server_event(r) for r in raw)
    assert not {"input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"} & set(s.raw_types())
    return s


def test_manual_push_to_talk_turns_without_errors(url):
    async def flow(s: ManualSession) -> None:
        for text in ("hello there", "good morning"):
            await s.push_to_talk(text)
            await s.reply(f"You said: {text}.")

    s = asyncio.run(manual_session(url, flow))
    assert s.errors() == []
    assert s.raw_types().count("response.created") == 2 and s.raw_types().count("input_audio_buffer.committed") == 2


def test_manual_typed_message_without_errors(url):
    async def flow(s: ManualSession) -> None:
        await s.session.send_message("Good morning")  # conversation.item.create + response.create
        await s.reply("You said: Good morning.")

    assert asyncio.run(manual_session(url, flow)).errors() == []


def test_manual_function_tool_round_trip(url):
    async def flow(s: ManualSession) -> None:
        await s.push_to_talk('call get_weather {"city": "Paris"}')
        await s.reply("The result is")  # the SDK sends function_call_output and its own response.create

    s = asyncio.run(manual_session(url, flow))
    assert s.errors() == []
    assert [e.tool.name for e in s.events if e.type == "tool_start"] == ["get_weather"]
    assert [e.output for e in s.events if e.type == "tool_end"] == ['{"city": "Paris", "temp_c": 21}']


def test_manual_interrupt_truncates_and_cancels_then_the_next_turn_is_answered(url):
    async def flow(s: ManualSession) -> None:
        await s.push_to_talk("tell me a long story about the sea")
        await s.until(lambda e: e.type == "audio")
        await s.session.interrupt()  # conversation.item.truncate + response.cancel
        await s.until(lambda e: e.type == "raw_model_event" and getattr(e.data, "type", None) == "raw_server_event"
                      and e.data.data.get("type") == "response.done")
        await s.push_to_talk("hello there")
        await s.reply("You said: hello there.")

    s = asyncio.run(manual_session(url, flow))
    assert s.errors() == []
    done = [r for r in _raw_server_events(s.events) if r["type"] == "response.done"]
    assert [d["response"]["status"] for d in done] == ["cancelled", "completed"]
    assert "conversation.item.truncated" in s.raw_types()


def test_manual_clear_drops_the_appended_audio(url):
    async def flow(s: ManualSession) -> None:
        await s.session.send_audio(speech_24k("never mind"))
        await s.raw({"type": "input_audio_buffer.clear"})
        await s.push_to_talk("hello there")
        await s.reply("You said: hello there.")

    s = asyncio.run(manual_session(url, flow))
    assert s.errors() == []
    transcripts = [r["transcript"] for r in _raw_server_events(s.events)
                   if r["type"] == "conversation.item.input_audio_transcription.completed"]
    assert transcripts == ["hello there"] and "input_audio_buffer.cleared" in s.raw_types()
