"""The benchmark session driver (``bench/driver.py``) against the real simulator server over real WebSockets."""

from __future__ import annotations

import asyncio
import base64
import importlib.util

import pytest

from vllm_omni_voicechat.audio.frames import FRAME_SECONDS
from vllm_omni_voicechat.bench.driver import (
    dialect_for,
    route_for,
    run_session,
    slim,
    ws_url,
)
from vllm_omni_voicechat.bench.workload import script_frames
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.sim.model import SimBehaviour

from .server_fixture import RawClient, running_server

HAS_CHECKER = importlib.util.find_spec("vllm_omni_voicechat.trace") is not None


class VirtualClock:
    """Time moves only when the driver sleeps: pacing is exact and costs no wall time."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)
        self.now += delay
        await asyncio.sleep(0)  # ok: one loop turn (a yield), the virtual clock already advanced


def frames_of(script: str) -> list[list[bytes]]:
    return [frames for _, frames in script_frames(script)]


@pytest.fixture(scope="module")
def url():
    with running_server(ServerConfig.simulator(max_sessions=4)) as base:
        yield base


@pytest.mark.parametrize("path, route", [
    ("/v1/voicechat", "v3"),
    ("/v1/voicechat?model=sim", "v3"),
    ("/v1/realtime", "v3"),
    ("/v1/realtime?model=sim", "tiered-openai"),
    ("/v1/realtime?duplex=1&model=sim", "tiered"),
    ("/v1/realtime?duplex=on", "tiered"),
    ("/v1/duplex", "tiered"),
    ("/v1/duplex?model=sim", "tiered"),
])
def test_route_for_follows_the_server_routing(path, route):
    assert route_for("ws://h:1" + path) == route
    assert dialect_for("http://h:1" + path) == ("v3" if route == "v3" else "tiered")


def test_route_for_bare_realtime_default_and_refusals():
    assert route_for("ws://h/v1/realtime", realtime_default="tiered-openai") == "tiered-openai"
    with pytest.raises(ValueError, match="off"):
        route_for("ws://h/v1/realtime?duplex=0")
    with pytest.raises(ValueError, match="not a voicechat"):
        route_for("ws://h/v1/chat/completions")


def test_ws_url_and_slim():
    assert ws_url("http://h:1/v1/duplex") == "ws://h:1/v1/duplex"
    assert ws_url("https://h/v1/duplex") == "wss://h/v1/duplex"
    assert ws_url("ws://h/x") == "ws://h/x"
    audio = base64.b64encode(bytes(10)).decode()
    assert slim({"type": "input_audio_buffer.append", "audio": audio, "encoding": "pcm16"}) == {
        "type": "input_audio_buffer.append", "encoding": "pcm16", "audio_bytes": 10}
    assert slim({"type": "response.output_audio.delta", "delta": audio, "response_id": "r"}) == {
        "type": "response.output_audio.delta", "response_id": "r", "audio_bytes": 10}
    other = {"type": "response.output_text.delta", "delta": "hi"}
    assert slim(other) is other


def test_v3_two_turns_paced_on_a_virtual_clock(url):
    clock = VirtualClock()
    turns = frames_of("hello there\ngood morning")
    result = asyncio.run(run_session(url + "/v1/voicechat", turns, clock=clock, sleep=clock.sleep,
                                     stream_silence=False))
    assert result.all_errors == [] and result.ok
    assert (result.dialect, result.close_code, result.checked) == ("v3", 1000, HAS_CHECKER)
    assert [t.text for t in result.turns] == ["You said: hello there.", "You said: good morning."]
    assert [t.input_frames for t in result.turns] == [len(f) for f in turns]
    # every frame goes out on its 80 ms slot from the turn's first frame; the commit one slot after the last
    sent = [(t, e["type"]) for t, is_sent, e in result.trace if is_sent]
    assert [k for _, k in sent] == (
        ["session.update"]
        + [k for f in turns for k in ["input_audio_buffer.turn_start", *["input_audio_buffer.append"] * len(f),
                                      "input_audio_buffer.commit"]]
        + ["session.stop"])
    i = 1
    for f in turns:
        t0 = sent[i + 1][0]
        slots = [round((t - t0) / FRAME_SECONDS, 9) for t, _ in sent[i + 1: i + 2 + len(f)]]
        assert slots == list(range(len(f) + 1))
        i += len(f) + 2
    assert sum(clock.slept) == pytest.approx(sum(len(f) for f in turns) * FRAME_SECONDS)
    for t in result.turns:  # strict v3 reports every position's budget (whether a step overran is the host's speed)
        assert t.positions and t.positions > 0
        assert isinstance(t.over_budget_positions, list) and all(type(p) is int for p in t.over_budget_positions)
        assert t.status == "completed" and t.audio_deltas > 0


@pytest.mark.parametrize("path", ["/v1/voicechat", "/v1/duplex"])
def test_the_microphone_stays_open_until_response_done(url, path):
    result = asyncio.run(run_session(url + path, frames_of("hi\nhello"), turn_timeout_s=20))
    assert result.ok, result.all_errors
    assert [t.text for t in result.turns] == ["You said: hi.", "You said: hello."]
    # per turn: speech frames, the commit, silent frames until (never after) that turn's response.done
    marks = []
    for t, sent, e in result.trace:
        if sent and e["type"] == "input_audio_buffer.commit":
            marks.append("commit")
        elif sent and e["type"] == "input_audio_buffer.append":
            marks.append("frame")
        elif not sent and e["type"] == "response.done":
            marks.append("done")
    turns = "".join("F" if m == "frame" else "C" if m == "commit" else "D" for m in marks)
    speech = [len(f) for f in frames_of("hi\nhello")]
    first, second = turns[: turns.index("D") + 1], turns[turns.index("D") + 1:]
    for turn, n in zip((first, second), speech):
        assert turn.startswith("F" * n + "C") and turn.endswith("D") and turn.count("D") == 1
        silent = turn[n + 1:-1]
        assert silent and set(silent) == {"F"}


@pytest.mark.parametrize("path", ["/v1/realtime?model=sim", "/v1/duplex"])
def test_tiered_lanes_unpaced_on_the_real_clock(url, path):
    # Non-default instructions make the OpenAI lane's session.updated wait for the prefill. With the autostart
    # prompt unchanged it is sent at once, and an unpaced commit can still beat the prefill (a server-side race).
    result = asyncio.run(run_session(url + path, frames_of("good morning\nhello"), realtime=False,
                                     instructions="Be brief.", turn_timeout_s=20))
    assert result.all_errors == [] and result.ok
    assert (result.dialect, result.close_code, result.checked) == ("tiered", 1000, HAS_CHECKER)
    assert [t.text for t in result.turns] == ["You said: good morning.", "You said: hello."]
    for t in result.turns:
        assert 0 <= t.commit_to_committed_ms <= t.commit_to_response_created_ms <= t.ttfa_ms
        assert t.audio_span_ms >= 0 and t.audio_ms > 0 and t.audio_rtf > 0
        assert t.positions is None and t.over_budget_positions is None  # no per-position telemetry here


def test_a_slow_model_shows_over_budget_positions():
    slow = ServerConfig.simulator(behaviour=SimBehaviour(step_delay_s=0.09, tail_positions=1))
    with running_server(slow) as base:
        result = asyncio.run(run_session(base + "/v1/voicechat", frames_of("hi"), realtime=False))
    assert result.ok, result.all_errors
    (turn,) = result.turns
    assert turn.positions and len(turn.over_budget_positions) == turn.positions
    assert turn.over_budget_positions == sorted(turn.over_budget_positions)


def test_a_busy_server_is_recorded_not_raised():
    with running_server(ServerConfig.simulator(max_sessions=1)) as base:
        holder = RawClient(base + "/v1/voicechat")
        assert holder.recv()["type"] == "session.created"
        result = asyncio.run(run_session(base + "/v1/voicechat", frames_of("hi"), realtime=False))
        holder.ws.close()
    assert not result.ok and result.turns == []
    assert any("server_busy" in e for e in result.errors)
    assert result.close_code == 1013


def test_a_response_that_never_ends_times_out_as_an_error():
    endless = ServerConfig.simulator(behaviour=SimBehaviour(endless_response=True))
    with running_server(endless) as base:
        # v3: a dropped tiered full-lane session would wait out its resume grace before the server stops
        result = asyncio.run(run_session(base + "/v1/voicechat", frames_of("hi"), realtime=False,
                                         turn_timeout_s=0.5))
    assert not result.ok
    assert "no response.done within 0.5 s of the commit" in result.errors
    (turn,) = result.turns
    assert turn.errors == ["session ended before response.done"] and turn.ttfa_ms is not None


def test_connect_failure_is_recorded():
    result = asyncio.run(run_session("ws://127.0.0.1:9/v1/voicechat", frames_of("hi"), connect_timeout_s=5))
    assert not result.ok and result.errors[0].startswith("connect failed")
