"""v3 function calls over real WebSockets (contract §10, with §7's PAD forcing / SOTC latch and §11's fatal table).

Each test drives a real uvicorn server (``tests.server_fixture``) with the raw JSON client and asserts the exact
events, fields and order the contract gives for a function-call transaction:

``response.function_call_arguments.done`` -> ``conversation.item.create{function_call_output}`` ->
``conversation.item.function_call_output.applied`` -> post-tool speech in the *same* response -> ``response.done``,

plus result validation, the tool timeout, the loop limit, the deferred-input FIFO, refusals during a cycle, the
deferred-BOS case, the recovery bound and pre-EOU function activity.

The simulator model calls a tool when the user *says* ``call NAME {json}``; it emits the call on its function
channel one token per position, waits for the result, injects it (one token per >= 80 ms recovery tick) and then
speaks ``The result is <output>.`` in the same response. While a response is open and the client sends no audio,
positions advance on the 80 ms response clock; tests that chain many calls stream microphone *silence* between
turns (as a live client does) so the call emission advances with the audio instead (:func:`Client.pump`). Recovery
ticks stay paced whatever the client does, so each call costs at least ~10 x 80 ms.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.sim.model import SimBehaviour, SimulatorModel

from .server_fixture import RawClient, running_server

MISSING: Any = object()
"""A key left out of a client event."""

FRAME_BYTES = 2560  # 1,280 PCM16 samples = one 80 ms model position
MAX_APPEND = 40_960  # the largest valid append (16 frames)
FENCE = 3  # settlement fence of the test servers (keeps turns short)
DEFERRED_LIMIT = 1 << 20  # the deferred FIFO bound: 1 MiB of JSON message bytes
MAX_OUTPUT_BYTES = 16_384
CLOSE_PROTOCOL, CLOSE_INTERNAL = 1002, 1011
CALL_ID = re.compile(r"^call_[0-9a-f]{32}$")

APPLIED = "conversation.item.function_call_output.applied"
CALL_DONE = "response.function_call_arguments.done"
CALL_FAILED = "response.function_call.failed"
AUDIO_DELTA = "response.output_audio.delta"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
    },
}
DASHED_WEATHER = {"type": "function", "function": {**WEATHER["function"], "name": "get-weather"}}
TINY = {
    "type": "function",
    "function": {"name": "f", "description": "A tool.", "parameters": {"type": "object", "properties": {}}},
}
"""The shortest call the simulator can emit (14 function-channel positions), for the chained-call tests."""

QUICK = SimBehaviour(reply_template="Ok.", tail_positions=0, prefill_delay_s=0.005)
"""A terse simulator: plain replies are ``Ok.``; a response ends on the position after its last token."""

MODEL_OUTPUT = {"function_output_model_output": "client_authored_v1"}

_open_clients: list[Client] = []


def b64(pcm: bytes) -> str:
    return base64.b64encode(pcm).decode("ascii")


def append_msg(pcm: bytes, event_id: str) -> dict:
    return {
        "type": "input_audio_buffer.append",
        "event_id": event_id,
        "encoding": "pcm16",
        "sample_rate": 16000,
        "channels": 1,
        "audio": b64(pcm),
    }


def turn_start(n: int, event_id: str | None = None) -> dict:
    return {"type": "input_audio_buffer.turn_start", "event_id": event_id or f"start-{n}", "client_turn_id": n}


def commit(n: int, event_id: str | None = None) -> dict:
    return {"type": "input_audio_buffer.commit", "event_id": event_id or f"commit-{n}", "client_turn_id": n}


def result_msg(call_id: Any, output: Any = "sunny", *, event_id: str, model_output: Any = MISSING) -> dict:
    item: dict[str, Any] = {"type": "function_call_output", "call_id": call_id}
    if output is not MISSING:
        item["output"] = output
    if model_output is not MISSING:
        item["model_output"] = model_output
    return {"type": "conversation.item.create", "event_id": event_id, "item": item}


def sim_config(behaviour: SimBehaviour = QUICK, **kw: Any) -> ServerConfig:
    kw.setdefault("settlement_blank_frames", FENCE)
    return ServerConfig.simulator(behaviour=behaviour, prefill_delay_s=0.005, **kw)


@contextlib.contextmanager
def serve(config: ServerConfig) -> Iterator[str]:
    """A dedicated server; the clients opened meanwhile are closed before it stops (no close-handshake wait)."""
    opened = len(_open_clients)
    with running_server(config) as url:
        try:
            yield url + "/v1/realtime"
        finally:
            for c in _open_clients[opened:]:
                c.close()


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The default server: 30 s tool wait, 256 recovery ticks; one session per test."""
    with serve(sim_config(max_sessions=8)) as url:
        yield url


# ================================================================ the client


@pytest.fixture(autouse=True)
def _event_ids_unique_and_clients_closed():
    """Every server event carries a unique event_id and the session_id; every client is closed after its test."""
    yield
    clients = list(_open_clients)
    _open_clients.clear()
    for c in clients:
        c.close()
    for c in clients:
        ids = [e["event_id"] for e in c.raw.received]
        assert len(ids) == len(set(ids)), "duplicate server event_id"
        assert all(e.get("session_id") == c.session_id for e in c.raw.received)


class Client:
    """The raw JSON client plus contract-level helpers. ``next``/``until`` skip ``voicechat.metrics``."""

    def __init__(self, url: str) -> None:
        self.raw = RawClient(url)
        _open_clients.append(self)
        created = self.raw.recv()
        assert created["type"] == "session.created"
        self.session_id = created["session_id"]
        self.created = created
        self._probe = 0
        self._pumps = 0

    def send(self, event: dict) -> None:
        self.raw.send(event)

    def next(self) -> dict:
        while True:
            e = self.raw.recv()
            if e["type"] != "voicechat.metrics":
                return e

    def until(self, predicate: Callable[[dict], bool], *, within: float = 30.0) -> list[dict]:
        """Events up to the first that satisfies ``predicate``; fails if that takes more than ``within`` seconds
        (metrics keep flowing while positions run, so the per-receive timeout alone would not end the wait)."""
        deadline = time.monotonic() + within
        out = []
        while True:
            assert time.monotonic() < deadline, f"no awaited event within {within} s; last: {out[-1:]}"
            out.append(self.next())
            if predicate(out[-1]):
                return out

    def until_type(self, *types: str) -> list[dict]:
        return self.until(lambda e: e["type"] in types)

    def mark(self) -> int:
        return len(self.raw.received)

    def metrics_since(self, mark: int) -> list[dict]:
        return [e for e in self.raw.received[mark:] if e["type"] == "voicechat.metrics"]

    def configure(self, tools: list[dict], *, model_output: bool = False) -> dict:
        session: dict[str, Any] = {"protocol_version": 3, "instructions": "Be brief.", "tools": tools}
        if model_output:
            session["capabilities"] = MODEL_OUTPUT
        self.send({"type": "session.update", "event_id": "update-1", "session": session})
        e = self.next()
        assert e["type"] == "session.updated", e
        assert e["session"]["capabilities"] == {
            "function_output_model_output": "client_authored_v1" if model_output else None
        }
        return e

    def say(self, n: int, text: str, *, pump: int = 0) -> None:
        """A complete microphone turn ``n`` speaking ``text`` (then ``pump`` frames of microphone silence)."""
        self.send(turn_start(n))
        self.send(append_msg(render_speech(text), f"append-{n}"))
        self.send(commit(n))
        if pump:
            self.pump(pump)

    def pump(self, frames: int = MAX_APPEND // FRAME_BYTES) -> None:
        """Microphone silence outside a turn: each frame is one (unpaced) model position."""
        self._pumps += 1
        self.send(append_msg(bytes(FRAME_BYTES * frames), f"silence-{self._pumps}"))

    def sync(self) -> list[dict]:
        """Send a side-effect-free probe; the events that arrived before its answer."""
        self._probe += 1
        eid = f"probe-{self._probe}"
        self.send({"type": f"probe.{self._probe}", "event_id": eid})
        events = self.until(lambda e: e["type"] == "error" and e["error"].get("client_event_id") == eid)
        assert events[-1]["error"]["code"] == "unsupported_event"
        return events[:-1]

    def expect_error(self, code: str, *, fatal: bool, client_event_id: Any = MISSING, details: dict | None = None,
                     skip: tuple[str, ...] = (AUDIO_DELTA,)) -> dict:
        """The next event that is not of a ``skip`` type is exactly this error; returns its ``error`` body."""
        e = self.next()
        while e["type"] in skip:
            e = self.next()
        assert_error(e, code, fatal=fatal, client_event_id=client_event_id, details=details)
        return e["error"]

    def close_code(self) -> int | None:
        return self.raw.close_code()

    def close(self) -> None:
        """Drain what already arrived, then close: a full receive queue would stall the close handshake."""
        with contextlib.suppress(Exception):
            while True:
                self.raw.received.append(json.loads(self.raw.ws.recv(timeout=0.05)))
        with contextlib.suppress(Exception):
            self.raw.close()

    def types(self) -> list[str]:
        return [e["type"] for e in self.raw.received if e["type"] != "voicechat.metrics"]


def assert_error(e: dict, code: str, *, fatal: bool, client_event_id: Any = MISSING, details: dict | None = None):
    assert e["type"] == "error", e
    assert set(e) == {"type", "event_id", "session_id", "error"}, e
    err = e["error"]
    assert (err["code"], err["fatal"]) == (code, fatal), err
    assert isinstance(err["message"], str) and err["message"], err
    if client_event_id is not MISSING:
        assert err.get("client_event_id") == client_event_id, err
    if details is not None:
        extra = {k: v for k, v in err.items() if k not in ("code", "message", "fatal", "client_event_id")}
        assert extra == details, err


def configured(url: str, tools: list[dict] | None = None, *, model_output: bool = False) -> Client:
    c = Client(url)
    c.configure([WEATHER] if tools is None else tools, model_output=model_output)
    return c


def first_call(c: Client, n: int = 1, text: str = 'call get_weather {"city": "Paris"}', *, pump: int = 0) -> list[dict]:
    """Say a call in turn ``n``; the events up to its ``function_call_arguments.done`` (checked for shape)."""
    c.say(n, text, pump=pump)
    events = c.until_type(CALL_DONE, "error")
    assert events[-1]["type"] == CALL_DONE, events[-1]
    assert_call_shape(events[-1])
    return events


def assert_call_shape(call: dict) -> None:
    assert set(call) == {"type", "event_id", "session_id", "turn_id", "response_id", "call_id", "name", "arguments"}
    assert CALL_ID.match(call["call_id"]), call
    assert isinstance(call["turn_id"], str) and call["turn_id"]
    assert isinstance(call["response_id"], str) and call["response_id"]
    assert isinstance(json.loads(call["arguments"]), dict)


def not_audio(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] != AUDIO_DELTA]


def assert_fatal_close(c: Client, code: int) -> None:
    """After a fatal error (other than the loop limit): close ``code`` with the fatal error's code as its reason,
    and no ``session.closed`` (§11)."""
    assert c.close_code() == code
    fatal_codes = [e["error"]["code"] for e in c.raw.received if e["type"] == "error" and e["error"]["fatal"]]
    assert fatal_codes and c.raw.close_reason == fatal_codes[0]
    assert "session.closed" not in c.types()


def response_text(events: list[dict], response_id: str) -> str:
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert all(e["response_id"] == response_id for e in deltas)
    text = "".join(e["delta"] for e in deltas)
    assert not deltas or deltas[-1]["text"] == text
    return text


# ================================================================ §10.1, §10.5: call -> result -> applied -> speech


def test_call_result_applied_then_post_tool_speech_in_the_same_response(server):
    c = configured(server)
    # keys out of order and "days" as a string: published sorted, compact, coerced to the schema's integer
    events = first_call(c, text='call get_weather {"days": "3", "city": "Paris"}')
    types = [e["type"] for e in not_audio(events)]
    assert types[:2] == ["input_audio_buffer.speech_started", "input_audio_buffer.turn_started"]
    assert types[-5:] == [
        "input_audio_buffer.committed",
        "input_audio_buffer.speech_stopped",
        "conversation.item.input_audio_transcription.completed",
        "response.created",
        CALL_DONE,
    ]
    started = not_audio(events)[1]
    created = next(e for e in events if e["type"] == "response.created")
    call = events[-1]
    turn_id, response_id = started["turn_id"], created["response_id"]
    assert created["turn_id"] == turn_id
    assert {k: call[k] for k in ("turn_id", "response_id", "name", "arguments")} == {
        "turn_id": turn_id,
        "response_id": response_id,
        "name": "get_weather",
        "arguments": '{"city":"Paris","days":3}',
    }
    # no assistant text before the result: nothing is fabricated
    assert "response.output_text.delta" not in types

    c.send(result_msg(call["call_id"], "sunny", event_id="result-1"))
    rest = c.until_type("response.done")
    assert [e["type"] for e in not_audio(rest)] == [
        APPLIED,
        *["response.output_text.delta"] * (len([e for e in rest if e["type"] == "response.output_text.delta"])),
        "response.output_text.done",
        "response.output_audio.done",
        "response.done",
    ]
    applied = not_audio(rest)[0]
    assert set(applied) == {"type", "event_id", "session_id", "call_id"}
    assert applied["call_id"] == call["call_id"]
    # post-tool speech (text and audio) stays in the same response of the same turn
    for e in rest:
        if e["type"] != APPLIED:
            assert (e["turn_id"], e["response_id"]) == (turn_id, response_id), e
    assert response_text(rest, response_id) == "The result is sunny."
    audio = [e for e in rest if e["type"] == AUDIO_DELTA]
    assert audio and all((e["encoding"], e["sample_rate"], e["channels"]) == ("pcm16", 22050, 1) for e in audio)
    text_done, audio_done, done = rest[-3:]
    assert (text_done["text"], text_done["empty"]) == ("The result is sunny.", False)
    assert audio_done["empty"] is False
    assert done["status"] == "completed"
    assert c.types().count("response.created") == 1
    assert c.types().count(APPLIED) == 1


class _UnderscoreNames(SimulatorModel):
    """A model whose function head writes the ``_``-normalized tool name (as NVIDIA's handler keys do)."""

    def _begin_cycle(self, call):
        name, args = call
        super()._begin_cycle((name.replace("-", "_"), args))


def test_negotiated_model_output_is_what_the_model_hears_and_the_dashed_name_is_advertised():
    config = sim_config()
    config.model_factory = lambda: _UnderscoreNames(QUICK)
    with serve(config) as url:
        c = configured(url, [DASHED_WEATHER], model_output=True)
        call = first_call(c, text='call get_weather {"city": "Oslo"}', pump=16)[-1]
        # the model wrote get_weather; the client sees the advertised name
        assert (call["name"], call["arguments"]) == ("get-weather", '{"city":"Oslo"}')
        # ``output`` is still validated when model_output is supplied: one byte over is rejected, the call pends
        report = json.dumps({"report": "x" * MAX_OUTPUT_BYTES})
        big = report[: MAX_OUTPUT_BYTES - len(report) - 2] + '"}'
        assert len(big.encode()) == MAX_OUTPUT_BYTES and json.loads(big)
        c.send(result_msg(call["call_id"], big + " ", event_id="result-1", model_output="21C and sunny"))
        c.expect_error("invalid_function_call_output", fatal=False, client_event_id="result-1",
                       details={"call_id": call["call_id"]})
        # exactly 16,384 bytes of output (far over 128 tokens) is fine: only model_output is injected
        c.send(result_msg(call["call_id"], big, event_id="result-2", model_output="21C and sunny"))
        rest = c.until_type("response.done")
        assert (not_audio(rest)[0]["type"], not_audio(rest)[0]["call_id"]) == (APPLIED, call["call_id"])
        assert "error" not in [e["type"] for e in rest]
        assert response_text(rest, call["response_id"]) == "The result is 21C and sunny."
        assert (rest[-1]["response_id"], rest[-1]["status"]) == (call["response_id"], "completed")


# ================================================================ §10.4: result validation


def _invalid_results(call_id: str) -> list[tuple[dict, str]]:
    """(item overrides, message fragment): every rejection for the pending call of a negotiated session."""
    over_bytes = "é" * (MAX_OUTPUT_BYTES // 2 + 1)  # 8,193 characters, 16,386 UTF-8 bytes
    return [
        ({"call_id": "call_" + "0" * 32}, "unknown or completed call_id"),
        ({"call_id": call_id.upper()}, "unknown or completed call_id"),
        ({"output": 5}, "string"),
        ({"output": None}, "string"),
        ({"output": MISSING}, "string"),
        ({"output": {"temp": 21}}, "string"),
        ({"output": over_bytes}, str(MAX_OUTPUT_BYTES)),
        ({"output": "ok", "model_output": ""}, "model_output"),
        ({"output": "ok", "model_output": 5}, "model_output"),
        ({"output": "ok", "model_output": over_bytes}, str(MAX_OUTPUT_BYTES)),
        ({"output": "a" * 600}, "maximum is 128"),  # ~159 tokens of at most 4 bytes
        ({"output": "ok", "model_output": "a" * 600}, "maximum is 128"),  # the injected value is model_output
        # <TOOL_RESPONSE>["a"*478"]</TOOL_RESPONSE> is 513 bytes: 129 four-byte tokens, one over the limit
        ({"output": "a" * 478}, "maximum is 128"),
    ]


def test_every_invalid_result_is_recoverable_and_the_call_stays_pending(server):
    c = configured(server, model_output=True)
    call = first_call(c, pump=16)[-1]
    call_id = call["call_id"]
    for i, (overrides, fragment) in enumerate(_invalid_results(call_id)):
        fields = {"call_id": call_id, "output": "sunny", **overrides}
        c.send(result_msg(fields.pop("call_id"), fields.pop("output"), event_id=f"bad-{i}", **fields))
        err = c.expect_error("invalid_function_call_output", fatal=False, client_event_id=f"bad-{i}",
                             details={"call_id": overrides.get("call_id", call_id)})
        assert fragment in err["message"], (overrides.keys(), err["message"])
    before = c.sync()
    assert not [e for e in before if e["type"] in (APPLIED, CALL_FAILED, "response.done")]
    # the call is still pending: a corrected resubmission completes it; a duplicate in flight is refused
    c.send(result_msg(call_id, "sunny", event_id="good"))
    c.send(result_msg(call_id, "cloudy", event_id="duplicate"))
    rest = c.until_type("response.done")
    errors = [e for e in rest if e["type"] == "error"]
    assert len(errors) == 1
    assert_error(errors[0], "invalid_function_call_output", fatal=False, client_event_id="duplicate",
                 details={"call_id": call_id})
    assert "unknown or completed call_id" in errors[0]["error"]["message"]
    applied = [e for e in rest if e["type"] == APPLIED]
    assert [e["call_id"] for e in applied] == [call_id]
    assert response_text(rest, call["response_id"]) == "The result is sunny."  # the first valid result won
    assert rest[-1]["status"] == "completed"
    # a second result for the applied call
    c.send(result_msg(call_id, "sunny", event_id="late"))
    err = c.expect_error("invalid_function_call_output", fatal=False, client_event_id="late",
                         details={"call_id": call_id})
    assert "unknown or completed call_id" in err["message"]
    assert not [e for e in c.sync() if e["type"] != AUDIO_DELTA]


def test_model_output_without_negotiation_is_rejected_and_the_call_stays_pending(server):
    c = configured(server)  # function_output_model_output not negotiated
    call = first_call(c, pump=16)[-1]
    c.send(result_msg(call["call_id"], "sunny", event_id="bad", model_output="cloudy"))
    err = c.expect_error("invalid_function_call_output", fatal=False, client_event_id="bad",
                         details={"call_id": call["call_id"]})
    assert "negotiated" in err["message"]
    c.send(result_msg(call["call_id"], "sunny", event_id="good"))
    rest = c.until_type("response.done")
    assert not_audio(rest)[0]["type"] == APPLIED and not_audio(rest)[0]["call_id"] == call["call_id"]
    assert response_text(rest, call["response_id"]) == "The result is sunny."
    assert rest[-1]["status"] == "completed"


def test_result_checks_run_in_order_the_call_lookup_last(server):
    """docs/v3-dialect.md, "Function results: the order of checks": each request below fails its step and every
    later one (the call id is always unknown), so the answer names the first failing step; the lookup is last."""
    over = "x" * (MAX_OUTPUT_BYTES + 1)
    bare = Client(server)
    bare.configure([])  # step 2: no tools
    bare.send({"type": "conversation.item.create", "event_id": "s1", "item": "nope"})
    bare.expect_error("invalid_conversation_item", fatal=False, client_event_id="s1")
    bare.send(result_msg("unknown", 5, event_id="s2", model_output="concise"))
    bare.expect_error("tools_not_set", fatal=False, client_event_id="s2")
    plain = configured(server)  # tools, model_output not negotiated
    negotiated = configured(server, model_output=True)
    steps = [
        (plain, {"output": 5, "model_output": "concise"}, "output must be a string"),  # 3
        (plain, {"output": over, "model_output": "concise"}, f"output exceeds {MAX_OUTPUT_BYTES}"),  # 4
        # 5: the reference's answer to the request (never "unknown or completed call_id")
        (plain, {"output": "ok", "model_output": "concise"},
         "model_output was not negotiated (function_output_model_output)"),
        (negotiated, {"output": "ok", "model_output": ""}, "model_output must be a non-empty string"),  # 6
        (negotiated, {"output": "ok", "model_output": over}, f"model_output exceeds {MAX_OUTPUT_BYTES}"),  # 7
        (plain, {"output": "a" * 600}, "maximum is 128"),  # 8: the injected value's tokens
        (plain, {"output": "ok"}, "unknown or completed call_id"),  # 9: the call lookup
    ]
    for i, (c, fields, message) in enumerate(steps, start=3):
        c.send(result_msg("unknown", fields.pop("output"), event_id=f"step-{i}", **fields))
        err = c.expect_error("invalid_function_call_output", fatal=False, client_event_id=f"step-{i}",
                             details={"call_id": "unknown"})
        assert message in err["message"], (i, err["message"])
    for c in (bare, plain, negotiated):  # every rejection was recoverable
        assert "session.closed" not in c.types()


# ================================================================ §10.6: tool timeout


def test_tool_timeout_fails_the_call_the_model_hears_it_and_the_session_goes_on():
    with serve(sim_config(function_call_timeout_s=0.5)) as url:
        c = configured(url)
        call = first_call(c, pump=16)[-1]
        t0 = time.monotonic()
        rest = c.until_type("response.done")
        failed = not_audio(rest)[0]
        assert time.monotonic() - t0 >= 0.4  # not before the (0.5 s) tool wait ran out
        assert failed == {
            "type": CALL_FAILED,
            "event_id": failed["event_id"],
            "session_id": c.session_id,
            "turn_id": call["turn_id"],
            "response_id": call["response_id"],
            "call_id": call["call_id"],
            "reason": "function_call_output_timeout",
        }
        assert APPLIED not in [e["type"] for e in rest]  # failed replaces applied as the call's terminal
        # the model received {"error":"function_call_output_timeout"} as the result, in the same response
        reply = response_text(rest, call["response_id"])
        assert reply == 'The result is {"error":"function_call_output_timeout"}.'
        assert (rest[-1]["response_id"], rest[-1]["status"]) == (call["response_id"], "completed")
        # a late result for the failed call
        c.send(result_msg(call["call_id"], "sunny", event_id="late"))
        err = c.expect_error("invalid_function_call_output", fatal=False, client_event_id="late",
                             details={"call_id": call["call_id"]})
        assert "unknown or completed call_id" in err["message"]
        # the session stays usable: another turn gets a complete response
        c.say(2, "Hi")
        turn = c.until_type("response.done")
        assert "error" not in [e["type"] for e in turn]
        assert response_text(turn, turn[-1]["response_id"]) == "Ok."
        assert turn[-1]["status"] == "completed" and turn[-1]["turn_id"] != call["turn_id"]


def test_tool_timeout_with_deferred_bos_is_fatal():
    with serve(sim_config(replace(QUICK, sotc_on_eou=True), function_call_timeout_s=0.5)) as url:
        c = configured(url)
        call = first_call(c, pump=16)[-1]
        rest = c.until_type("error")
        failed = not_audio(rest)[0]
        assert {k: failed[k] for k in ("type", "turn_id", "response_id", "call_id", "reason")} == {
            "type": CALL_FAILED,
            "turn_id": call["turn_id"],
            "response_id": call["response_id"],
            "call_id": call["call_id"],
            "reason": "function_call_output_timeout",
        }
        err = rest[-1]
        assert_error(err, "function_call_output_timeout", fatal=True,
                     details={"call_id": call["call_id"], "epoch_invalidation_error": None})
        # between them only the open response's terminal (failed; never applied, never a second response)
        between = not_audio(rest)[1:-1]
        assert [e["type"] for e in between] == [
            "response.output_text.done", "response.output_audio.done", "response.done"
        ]
        assert all(e["response_id"] == call["response_id"] for e in between)
        assert (between[0]["text"], between[0]["empty"], between[-1]["status"]) == ("", True, "failed")
        assert_fatal_close(c, CLOSE_INTERNAL)
        assert APPLIED not in c.types()
        assert c.types().count("response.done") <= 1


def test_input_held_during_a_timed_out_cycle_is_replayed_after_failed():
    with serve(sim_config(function_call_timeout_s=0.5)) as url:
        c = configured(url)
        call = first_call(c, pump=16)[-1]
        c.send(turn_start(2))
        c.send(append_msg(render_speech("Hi"), "append-2"))
        c.send(commit(2))
        events = not_audio(c.until(lambda e: e["type"] == "response.done" and e["response_id"] != call["response_id"]))
        types = [e["type"] for e in events]
        i_failed = types.index(CALL_FAILED)
        assert i_failed == 0 and events[0]["call_id"] == call["call_id"]
        # nothing of turn 2 before failed; then it replays like a barge-in on the still-open response
        assert types[1:6] == [
            "response.output_text.done",
            "response.output_audio.done",
            "response.done",
            "input_audio_buffer.speech_started",
            "input_audio_buffer.turn_started",
        ]
        assert (events[3]["response_id"], events[3]["status"], events[3]["reason"]) == (
            call["response_id"], "cancelled", "client_vad",
        )
        assert events[5]["client_event_id"] == "start-2"
        committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
        assert (committed["client_event_id"], committed["turn_id"]) == ("commit-2", events[5]["turn_id"])
        assert APPLIED not in types
        assert (events[-1]["turn_id"], events[-1]["status"]) == (events[5]["turn_id"], "completed")


def test_capabilities_advertise_the_configured_tool_wait_and_recovery_bound():
    # regression: the advertised values were once the fixed production defaults whatever the server ran with
    with serve(sim_config(function_call_timeout_s=0.5, function_recovery_max_frames=20)) as url:
        c = Client(url)
        caps = c.created["capabilities"]
        assert caps["function_call_timeout_seconds"] == 0.5  # "the server waits this long for a tool result"
        assert caps["function_output_recovery_max_frames"] == 20  # "post-result recovery ticks"


# ================================================================ §10.3: the loop limit (8 calls per user turn)


def _answer_calls(c: Client, count: int, *, response_id: str | None = None) -> list[dict]:
    """Answer ``count`` successive calls with "1" (driving each emission with microphone silence)."""
    calls = []
    for i in range(count):
        events = c.until_type(CALL_DONE, "error")
        call = events[-1]
        assert call["type"] == CALL_DONE, call
        assert_call_shape(call)
        assert (call["name"], call["arguments"]) == ("f", "{}")
        if response_id is not None:
            assert call["response_id"] == response_id
        assert "response.output_text.delta" not in [e["type"] for e in events]  # no answer between calls
        calls.append(call)
        c.send(result_msg(call["call_id"], "1", event_id=f"result-{call['call_id']}"))
        applied = [e for e in c.until_type(APPLIED, "error") if e["type"] != AUDIO_DELTA]
        assert [(e["type"], e.get("call_id")) for e in applied] == [(APPLIED, call["call_id"])]
        c.pump()
    return calls


def test_ninth_call_in_one_turn_is_never_published_and_trips_the_loop_limit():
    with serve(sim_config(replace(QUICK, chained_calls=9))) as url:
        c = configured(url, [TINY])
        c.say(1, "call f", pump=16)
        calls = _answer_calls(c, 8)
        turn_id, response_id = calls[0]["turn_id"], calls[0]["response_id"]
        assert all((k["turn_id"], k["response_id"]) == (turn_id, response_id) for k in calls)
        assert len({k["call_id"] for k in calls}) == 8
        tail = not_audio(c.until(lambda e: e["type"] == "session.closed"))
        assert [e["type"] for e in tail] == [
            "response.output_text.done",
            "response.output_audio.done",
            "response.done",
            "error",
            "session.closed",
        ]
        text_done, audio_done, done, err, closed = tail
        assert (text_done["turn_id"], text_done["response_id"], text_done["text"], text_done["empty"]) == (
            turn_id, response_id, "", True,  # no assistant answer is fabricated
        )
        assert (audio_done["turn_id"], audio_done["response_id"]) == (turn_id, response_id)
        # audio_done["empty"] is left unchecked: §10.3 says empty:true, but §5 defines it as "no audio delta was
        # sent", and this response did stream (silent) audio deltas while the calls were emitted.
        assert isinstance(audio_done["empty"], bool)
        assert (done["turn_id"], done["response_id"], done["status"], done["reason"]) == (
            turn_id, response_id, "failed", "function_call_loop_limit",
        )
        ninth = err["error"]["call_id"]
        assert_error(err, "function_call_loop_limit", fatal=True,
                     details={"call_id": ninth, "attempt": 9, "limit": 8})
        assert CALL_ID.match(ninth) and ninth not in {k["call_id"] for k in calls}
        assert (closed["status"], closed["reason"]) == ("failed", "function_call_loop_limit")
        assert c.close_code() == CLOSE_INTERNAL
        assert c.raw.close_reason == "function_call_loop_limit"
        assert c.types().count(CALL_DONE) == 8  # the 9th is never published
        assert c.raw.received[-1]["type"] == "session.closed"


def test_eight_chained_calls_in_one_turn_all_succeed():
    with serve(sim_config(replace(QUICK, chained_calls=8))) as url:
        c = configured(url, [TINY])
        c.say(1, "call f", pump=16)
        calls = _answer_calls(c, 8)
        response_id = calls[0]["response_id"]
        rest = c.until_type("response.done", "error")
        assert [e["type"] for e in not_audio(rest)][-3:] == [
            "response.output_text.done", "response.output_audio.done", "response.done"
        ]
        assert CALL_DONE not in [e["type"] for e in rest] and "error" not in [e["type"] for e in rest]
        assert response_text(rest, response_id) == "The result is 1."
        assert (rest[-1]["response_id"], rest[-1]["status"]) == (response_id, "completed")
        assert len({k["call_id"] for k in calls}) == 8
        assert all(k["response_id"] == response_id for k in calls)


def test_a_new_user_turn_starts_a_fresh_call_budget():
    with serve(sim_config(replace(QUICK, chained_calls=5))) as url:
        c = configured(url, [TINY])
        seen = []
        for n in (1, 2):
            c.say(n, "call f", pump=16)
            calls = _answer_calls(c, 5)
            rest = c.until_type("response.done", "error")
            assert rest[-1]["type"] == "response.done" and rest[-1]["status"] == "completed", rest[-1]
            assert CALL_DONE not in [e["type"] for e in rest]
            assert response_text(rest, calls[0]["response_id"]) == "The result is 1."
            assert len({(k["turn_id"], k["response_id"]) for k in calls}) == 1
            seen.extend(calls)
        assert len({k["call_id"] for k in seen}) == 10  # 10 calls in the session, no loop limit
        assert seen[0]["turn_id"] != seen[5]["turn_id"] and seen[0]["response_id"] != seen[5]["response_id"]
        assert "session.closed" not in c.types() and "error" not in c.types()


# ================================================================ §10.2: input during a published cycle


def test_microphone_input_during_a_cycle_is_deferred_and_replayed_in_order(server):
    c = configured(server)
    call = first_call(c, pump=16)[-1]
    # a non-compliant client keeps talking: start, two appends of speech and the commit of turn 2
    speech = render_speech("What is up")
    half = len(speech) // 2 // FRAME_BYTES * FRAME_BYTES
    c.send(turn_start(2))
    c.send(append_msg(speech[:half], "append-2a"))
    c.send(append_msg(speech[half:], "append-2b"))
    c.send(commit(2))
    held = c.sync()
    assert [e["type"] for e in held] == [AUDIO_DELTA] * len(held)  # nothing acknowledged while the cycle is open
    c.send(result_msg(call["call_id"], "sunny", event_id="result-1"))
    events = not_audio(c.until(lambda e: e["type"] == "response.done" and e["response_id"] != call["response_id"]))
    types = [e["type"] for e in events]
    n_deltas = types.count("conversation.item.input_audio_transcription.delta")
    n_text = types.count("response.output_text.delta")
    assert n_deltas >= 1
    assert types == [
        APPLIED,
        # the post-tool response is still open: cancelled to its terminal first (barge-in, §6.5)
        "response.output_text.done",
        "response.output_audio.done",
        "response.done",
        # then the deferred turn, exactly as if it arrived now
        "input_audio_buffer.speech_started",
        "input_audio_buffer.turn_started",
        *["conversation.item.input_audio_transcription.delta"] * n_deltas,
        "input_audio_buffer.committed",
        "input_audio_buffer.speech_stopped",
        "conversation.item.input_audio_transcription.completed",
        "response.created",
        *["response.output_text.delta"] * n_text,
        "response.output_text.done",
        "response.output_audio.done",
        "response.done",
    ]
    assert events[0]["call_id"] == call["call_id"]
    cancelled = events[3]
    assert (cancelled["response_id"], cancelled["turn_id"], cancelled["status"], cancelled["reason"]) == (
        call["response_id"], call["turn_id"], "cancelled", "client_vad",
    )
    speech_started, started = events[4], events[5]
    turn2 = started["turn_id"]
    assert turn2 != call["turn_id"]
    assert (speech_started["turn_id"], speech_started["source"], speech_started["correlation"]) == (
        turn2, "microphone", 2,
    )
    assert (started["client_event_id"], started["client_turn_id"]) == ("start-2", 2)
    committed = events[6 + n_deltas]
    assert (committed["client_event_id"], committed["client_turn_id"], committed["turn_id"]) == ("commit-2", 2, turn2)
    completed = events[8 + n_deltas]
    assert completed["transcript"] == "What is up"  # both held appends were replayed, in order
    assert events[9 + n_deltas]["turn_id"] == turn2 and events[-1]["status"] == "completed"


def test_deferred_input_overflow_is_fatal_1002(server):
    c = configured(server)
    first_call(c, pump=16)
    # the held turn_start counts too: the FIFO bound is on the UTF-8 bytes of the held JSON messages
    total, overflow_at = len(json.dumps(turn_start(2)).encode()), None
    for i in range(30):
        size = len(json.dumps(append_msg(bytes(MAX_APPEND), f"big-{i:02d}")).encode())
        if total + size > DEFERRED_LIMIT:
            overflow_at = i
            break
        total += size
    assert overflow_at == 19
    with contextlib.suppress(ConnectionClosed):
        c.send(turn_start(2))
        for i in range(30):
            c.send(append_msg(bytes(MAX_APPEND), f"big-{i:02d}"))
    events = c.until_type("error")
    err = events[-1]
    assert_error(err, "deferred_input_overflow", fatal=True)
    assert err["error"]["client_event_id"] == f"big-{overflow_at:02d}"  # the append that overflowed the FIFO
    assert not [e for e in events if e["type"].startswith("input_audio_buffer.")]  # nothing held was processed
    assert_fatal_close(c, CLOSE_PROTOCOL)
    assert APPLIED not in c.types()


def test_typed_input_and_session_update_during_a_cycle_are_refused(server):
    c = configured(server)
    call = first_call(c, pump=16)[-1]
    c.send({"type": "input_text.request", "event_id": "typed-1", "job_id": "job-1", "text": "Hello"})
    e = c.until(lambda e: e["type"] != AUDIO_DELTA)[-1]
    assert {k: e[k] for k in ("type", "job_id", "reason")} == {
        "type": "input_text.rejected", "job_id": "job-1", "reason": "function_cycle_active",
    }
    c.send({"type": "session.update", "event_id": "update-2",
            "session": {"protocol_version": 3, "instructions": "Be brief.", "tools": [WEATHER]}})
    c.expect_error("settings_locked", fatal=False, client_event_id="update-2", details={})
    # the cycle is unaffected
    c.send(result_msg(call["call_id"], "sunny", event_id="result-1"))
    rest = c.until_type("response.done")
    assert not_audio(rest)[0]["type"] == APPLIED
    assert response_text(rest, call["response_id"]) == "The result is sunny."
    # once the cycle is over, typed input is admitted again
    c.send({"type": "input_text.request", "event_id": "typed-2", "job_id": "job-2", "text": "Hello"})
    typed = not_audio(c.until(lambda e: e["type"] == "input_text.injection_finished"))
    assert [e["type"] for e in typed][:2] == ["input_text.accepted", "input_text.injection_started"]
    assert typed[-1]["disposition"] == "completed"


# ================================================================ §10.7, §7: SOTC on the EOU position (deferred BOS)


def test_sotc_on_the_eou_position_defers_bos_until_after_the_result():
    with serve(sim_config(replace(QUICK, sotc_on_eou=True))) as url:
        c = configured(url)
        mark = c.mark()
        events = first_call(c, pump=16)
        types = [e["type"] for e in events]
        assert types[-5:] == [
            "input_audio_buffer.committed",
            "input_audio_buffer.speech_stopped",
            "conversation.item.input_audio_transcription.completed",
            "response.created",  # only now, right before the call: not at the EOU position
            CALL_DONE,
        ]
        committed, created, call = events[-5], events[-2], events[-1]
        turn_id = committed["turn_id"]
        assert created["turn_id"] == call["turn_id"] == turn_id  # published with the user turn_id
        assert call["response_id"] == created["response_id"]
        assert (call["name"], call["arguments"]) == ("get_weather", '{"city":"Paris"}')
        # the EOU position: right after completed, no response, agent BOS not taken; the SOTC staged there
        window = c.raw.received[mark:]
        i_completed = next(i for i, e in enumerate(window) if e["type"].endswith("transcription.completed"))
        eou = window[i_completed + 1]
        assert eou["type"] == "voicechat.metrics" and eou["turn_state"]["kind"] == "eou"
        assert eou["response_id"] is None and eou["turn_state"]["agent_control"] == "pad"
        model = eou["turn_state"]["model"]
        assert (model["client_eou_sotc_staged_count"], model["client_eou_sotc_staged_frame"]) == (1, eou["frame"])
        assert model["client_eou_sotc_committed_count"] == 0
        # replayed once, on the next position
        nxt = window[i_completed + 2]
        assert nxt["type"] == "voicechat.metrics"
        assert nxt["turn_state"]["model"]["client_eou_sotc_committed_count"] == 1
        assert nxt["turn_state"]["model"]["client_eou_sotc_committed_frame"] == eou["frame"] + 1

        mark = c.mark()
        c.send(result_msg(call["call_id"], "sunny", event_id="result-1"))
        rest = c.until_type("response.done")
        i_applied = next(i for i, e in enumerate(c.raw.received[mark:]) if e["type"] == APPLIED)
        before_applied = c.raw.received[mark:][:i_applied]
        bos = [e for e in before_applied if e["type"] == "voicechat.metrics"
               and e["turn_state"]["agent_control"] == "agent_bos"]
        assert len(bos) == 1  # the deferred BOS came before applied, in the open response
        assert bos[0]["turn_state"]["kind"] == "recovery" and bos[0]["response_id"] == call["response_id"]
        assert before_applied[-1] is bos[0]  # applied follows the BOS position
        assert [e["type"] for e in not_audio(rest)][0] == APPLIED
        assert response_text(rest, call["response_id"]) == "The result is sunny."
        assert (rest[-1]["response_id"], rest[-1]["status"]) == (call["response_id"], "completed")
        assert c.types().count("response.created") == 1
        # telemetry: staged once, replayed once, for the whole session
        final = c.metrics_since(0)[-1]["turn_state"]["model"]
        assert final["client_eou_sotc_staged_count"] == 1
        assert final["client_eou_sotc_committed_count"] == 1


# ================================================================ §10.5: the recovery bound


def test_recovery_that_never_goes_idle_is_fatal_function_output_apply_timeout():
    behaviour = replace(QUICK, function_never_finishes=True)
    with serve(sim_config(behaviour, function_recovery_max_frames=20)) as url:
        c = configured(url)
        call = first_call(c, pump=16)[-1]
        mark = c.mark()
        t0 = time.monotonic()
        c.send(result_msg(call["call_id"], "sunny", event_id="result-1"))
        events = c.until_type("error")
        elapsed = time.monotonic() - t0
        assert_error(events[-1], "function_output_apply_timeout", fatal=True, details={"call_id": call["call_id"]})
        assert APPLIED not in [e["type"] for e in events]
        recovery = [m for m in c.metrics_since(mark) if m["turn_state"]["kind"] == "recovery"]
        assert len(recovery) == 20
        assert all(m["turn_state"]["function_cycle"] == call["call_id"] for m in recovery)
        frames = [m["frame"] for m in recovery]
        assert frames == list(range(frames[0], frames[0] + 20))  # consecutive model positions
        assert elapsed >= 19 * 0.08 * 0.95  # paced at >= 80 ms (a lower bound only)
        assert_fatal_close(c, CLOSE_INTERNAL)
        assert APPLIED not in c.types()


# ================================================================ §7: function activity before the EOU


def test_self_started_function_during_settlement_is_fatal_and_never_published():
    # "Hi" fits in one (padded) frame: position 0 is the commit padding, 1..3 are settlement positions
    with serve(sim_config(replace(QUICK, self_start_function_at=2))) as url:
        c = configured(url)
        c.say(1, "Hi")
        events = c.until_type("error")
        err = events[-1]
        assert_error(err, "pre_eou_function_activity", fatal=True)
        assert err["error"]["settlement"]["target_blank_frames"] == FENCE
        assert (err["error"]["source"], err["error"]["job_id"]) == ("microphone", None)
        assert_fatal_close(c, CLOSE_INTERNAL)
        frames = [e["frame"] for e in c.raw.received if e["type"] == "voicechat.metrics" and e["frame"] is not None]
        assert frames == [0, 1]  # the violating position 2 is never published
        types = c.types()
        for never in ("input_audio_buffer.committed", "response.created", CALL_DONE, "voicechat.function_text.delta"):
            assert never not in types


def test_function_head_sotc_during_settlement_is_forced_to_pad():
    with serve(sim_config(replace(QUICK, function_head_sotc_at=2))) as url:
        c = configured(url)
        c.say(1, "Hi")
        events = c.until_type("response.done", "error")
        assert events[-1]["type"] == "response.done" and events[-1]["status"] == "completed", events[-1]
        assert CALL_DONE not in [e["type"] for e in events]
        assert response_text(events, events[-1]["response_id"]) == "Ok."
        model = c.metrics_since(0)[-1]["turn_state"]["model"]
        assert (model["pre_eou_suppressed_tokens"], model["pre_eou_suppressed_frame"]) == (1, 2)
        assert model["client_eou_sotc_staged_count"] == 0 and model["client_eou_sotc_committed_count"] == 0
