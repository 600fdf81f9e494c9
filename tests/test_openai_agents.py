"""The openai-agents SDK's realtime session (pinned 0.24.0) over the OpenAI-compatible lane, on the simulator.

Skipped where openai-agents is not installed (it pins websockets<17, so CI runs it in its own venv).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import soxr

from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.sim.speech import render_speech

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
