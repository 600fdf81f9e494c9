"""Function calls through the session core and runner, on the simulator and the injected virtual clock (§10).

Publication (ids, name mapping, argument coercion), result validation, the paced recovery and its bound, the
tool timeout, the loop limit, per-turn budgets, the deferred-input FIFO, typed requests during a cycle, calls
suppressed by a barge-in, deferred BOS and the system prompt's tool block. No real time is used: the driver runs
positions back to back and jumps its virtual clock to every deadline the core asks for.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.model.port import AgentControl, SessionPrompt, ToolCall, ToolSpec
from vllm_omni_voicechat.model.prompt import (
    GROUNDING,
    TOOLS_CLOSE,
    TOOLS_OPEN,
    render_system_prompt,
    tools_from_prompt,
    wrap_tool_result,
)
from vllm_omni_voicechat.model.tokens import split_tokens
from vllm_omni_voicechat.session.commands import (
    AppendAudio,
    CommitTurn,
    Configure,
    RequestTypedInput,
    StartTurn,
    SubmitFunctionOutput,
)
from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.session.events import (
    AbortModel,
    AudioDelta,
    Error,
    FunctionCallFailed,
    FunctionCallPublished,
    NativeEvent,
)
from vllm_omni_voicechat.session.functions import (
    DEFERRED_INPUT_MAX_BYTES,
    FUNCTION_CALL_TIMEOUT_S,
    FUNCTION_OUTPUT_MAX_BYTES,
    FUNCTION_OUTPUT_MAX_TOKENS,
    FUNCTION_OUTPUT_RECOVERY_MAX_FRAMES,
    MAX_FUNCTION_CALLS_PER_RESPONSE,
    Cycle,
    DeferredInput,
    OutputRejected,
    advertised_name,
    arguments_json,
    call_id_for,
    result_tokens,
)
from vllm_omni_voicechat.shell.sync import SyncDriver
from vllm_omni_voicechat.sim.model import EOTR, SimBehaviour, SimulatorModel
from vllm_omni_voicechat.synth.simulated import SimulatorSynthesizer

from .helpers import SID, R, T, metrics, names, protocol

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "temp": {"type": "number"},
        "metric": {"type": "boolean"},
    },
}
TOOLS = (ToolSpec("get-weather", "Weather for a city", SCHEMA),)
PARIS = 'call get_weather {"city":"Paris"}'
SUNNY = '"sunny"'
FRAME = 0.08


# ------------------------------------------------------------------------------------------------ harness


class Harness:
    """A SyncDriver session with spies: event times on the virtual clock, begun positions, model steps."""

    def __init__(self, behaviour: SimBehaviour | None = None, *, step_seconds: float = 0.001,
                 tools: tuple[ToolSpec, ...] = TOOLS, **config: Any) -> None:
        config.setdefault("session_id", SID)
        config.setdefault("settlement_blank_frames", 3)
        self.core = SessionCore(SessionConfig(**config))
        self.model = SimulatorModel(behaviour)
        self.stamps: list[tuple[float, NativeEvent]] = []
        self.d = SyncDriver(self.core, self.model, synthesizer=SimulatorSynthesizer(), step_seconds=step_seconds,
                            on_event=lambda e: self.stamps.append((self.d.clock.now, e)))
        self.positions: list = []  # runner Positions (kind, due, started)
        self.steps: list = []  # (PositionInput, StepResult)
        begin = self.core.runner.begin
        step = self.model.step

        def spy_begin(*args, **kwargs):
            position = begin(*args, **kwargs)
            self.positions.append(position)
            return position

        def spy_step(position_input):
            result = self.rewrite(step(position_input))
            self.steps.append((position_input, result))
            return result

        self.core.runner.begin = spy_begin  # type: ignore[method-assign]
        self.model.step = spy_step  # type: ignore[method-assign]
        self.rewrite: Callable = lambda result: result
        self.answered: set[str] = set()
        self.d.send(Configure(SessionPrompt("Be brief.", tools)))
        self.d.events.clear()
        self.stamps.clear()

    @property
    def events(self) -> list[NativeEvent]:
        return self.d.events

    def say(self, k: int, text: str) -> None:
        self.d.send(StartTurn(k, f"s{k}"))
        self.d.send(AppendAudio(render_speech(text)))
        self.d.send(CommitTurn(k, f"c{k}"))

    def published(self) -> list[FunctionCallPublished]:
        return [e for e in self.events if isinstance(e, FunctionCallPublished)]

    def step_once(self) -> bool:
        before = self.d.positions
        self.d.run(max_positions=1)
        return self.d.positions != before

    def run_until(self, predicate: Callable[[], bool], limit: int = 2000) -> None:
        for _ in range(limit):
            if predicate():
                return
            if not self.step_once():
                break
        assert predicate(), "condition never reached"

    def run_answering(self, answer: Callable[[FunctionCallPublished], str | None] = lambda e: SUNNY,
                      limit: int = 6000) -> None:
        """Run to idle, submitting ``answer(call)`` for every call as soon as it is published."""
        for _ in range(limit):
            for call in self.published():
                if call.call_id not in self.answered:
                    self.answered.add(call.call_id)
                    output = answer(call)
                    if output is not None:
                        self.d.send(SubmitFunctionOutput(call.call_id, output, client_event_id=f"out-{call.call_id}"))
            if not self.step_once():
                return
        raise AssertionError("session never went idle")

    def time_of(self, kind: type) -> float:
        return next(t for t, e in self.stamps if isinstance(e, kind))

    def fed_results(self) -> list[tuple[str, ...]]:
        return [i.controls.tool_result_tokens for i, _ in self.steps if i.controls.tool_result_tokens]


def wrapped_tokens(value: str) -> tuple[str, ...]:
    return tuple(split_tokens(wrap_tool_result(value)))


def errors(events) -> list[Error]:
    return [e for e in events if isinstance(e, Error)]


# ------------------------------------------------------------------------------------------ publication


def test_published_call_exact_events_then_applied_and_post_tool_speech_in_the_same_response():
    h = Harness()
    h.say(1, 'call get_weather {"city":"Paris","days":"3","temp":"2.5","metric":"true"}')
    h.run_answering()
    cid = call_id_for(SID, 1)
    p = protocol(h.events)
    i = p.index(("TurnCommitted", T(1), 1, "c1"))
    assert p[i:] == [
        ("TurnCommitted", T(1), 1, "c1"),
        ("SpeechStopped", T(1), "microphone", None),
        ("TranscriptCompleted", T(1), 'call get_weather {"city":"Paris","days":"3","temp":"2.5","metric":"true"}',
         "microphone", None),
        ("ResponseCreated", T(1), R(1)),
        # advertised name, coerced arguments as compact sorted-key JSON
        ("FunctionCallPublished", T(1), R(1), cid, "get-weather", '{"city":"Paris","days":3,"metric":true,"temp":2.5}'),
        ("FunctionOutputApplied", cid),
        ("TextDelta", T(1), R(1), "The", "The"),
        ("TextDelta", T(1), R(1), " res", "The res"),
        ("TextDelta", T(1), R(1), "ult", "The result"),
        ("TextDelta", T(1), R(1), " is", "The result is"),
        ("TextDelta", T(1), R(1), " sun", "The result is sun"),
        ("TextDelta", T(1), R(1), "ny.", "The result is sunny."),
        ("TextDone", T(1), R(1), "The result is sunny."),
        ("AudioDone", T(1), R(1), False),
        ("ResponseDone", T(1), R(1), "completed", "post_eos_audio_silence"),
    ]
    assert not h.core.closed and h.core.cycle is None
    # The model got exactly the wrapped result, on the first recovery position; one position per token + EOTR.
    tokens = wrapped_tokens(SUNNY)
    assert h.fed_results() == [tokens]
    recovery = metrics(h.events, "recovery")
    assert len(recovery) == len(tokens) + 1
    first_recovery = next(k for k, (i, _) in enumerate(h.steps) if i.controls.tool_result_tokens)
    assert h.positions[first_recovery].kind.value == "recovery"
    rec_results = [r for (_, r), pos in zip(h.steps, h.positions) if pos.kind.value == "recovery"]
    assert [r.function.token for r in rec_results] == [*tokens, EOTR]
    assert not rec_results[-1].function.busy  # the completing tick ends exactly at the cycle boundary
    assert all(m.turn_state["function_cycle"] == cid for m in recovery)


def test_awaiting_positions_keep_flowing_while_the_call_is_open():
    h = Harness()
    h.say(1, PARIS)
    h.run_until(lambda: bool(h.published()))
    n = len(h.events)
    for _ in range(5):
        assert h.step_once()
    waiting = metrics(h.events[n:])
    assert [m.kind for m in waiting] == ["response_silence"] * 5
    assert all(m.turn_state["function_cycle"] == call_id_for(SID, 1) for m in waiting)
    assert protocol(h.events[n:]) == []  # nothing but metrics (and audio) while waiting


def test_call_id_for_is_deterministic_unique_and_well_formed():
    assert call_id_for("S", 1) == "call_" + hashlib.sha256(b"S:1").hexdigest()[:32]
    assert call_id_for("S", 1) == call_id_for("S", 1)
    ids = {call_id_for("S", n) for n in range(1, 2001)}
    assert len(ids) == 2000
    assert all(re.fullmatch(r"call_[0-9a-f]{32}", i) for i in ids)
    assert call_id_for("S", 1) != call_id_for("S2", 1)


def test_advertised_name_maps_normalized_names_back():
    tools = (ToolSpec("get-weather"), ToolSpec("set_alarm"), ToolSpec("a-b_c"))
    assert advertised_name("get_weather", tools) == "get-weather"
    assert advertised_name("get-weather", tools) == "get-weather"
    assert advertised_name("set-alarm", tools) == "set_alarm"
    assert advertised_name("a_b_c", tools) == "a-b_c"
    assert advertised_name("unknown_tool", tools) == "unknown_tool"  # passed through as the model wrote it


def test_core_publishes_the_advertised_name_for_a_normalized_model_name():
    h = Harness()

    def normalized(result):
        if result.tool_call is None:
            return result
        # The model writes the `_`-normalized key (as NVIDIA's template does).
        return dataclasses.replace(result, tool_call=dataclasses.replace(result.tool_call, name="get_weather"))

    h.rewrite = normalized
    h.say(1, 'call get_weather {"city":"Paris","days":"7"}')
    h.run_until(lambda: bool(h.published()))
    call = h.published()[0]
    assert (call.name, call.arguments) == ("get-weather", '{"city":"Paris","days":7}')


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"days": "3"}, {"days": 3}),
        ({"days": " 42 "}, {"days": 42}),
        ({"days": "-7"}, {"days": -7}),
        ({"days": "3.5"}, {"days": "3.5"}),  # not an integer: left as given
        ({"days": "three"}, {"days": "three"}),
        ({"temp": "2.5"}, {"temp": 2.5}),
        ({"temp": "2"}, {"temp": 2}),
        ({"temp": "2.0"}, {"temp": 2.0}),
        ({"temp": "1e3"}, {"temp": 1000.0}),
        ({"temp": "warm"}, {"temp": "warm"}),
        ({"metric": "true"}, {"metric": True}),
        ({"metric": " FALSE "}, {"metric": False}),
        ({"metric": "yes"}, {"metric": "yes"}),
        ({"city": "3"}, {"city": "3"}),  # string schema: never coerced
        ({"other": "3"}, {"other": "3"}),  # not in the schema
        ({"days": 5, "metric": False, "temp": None}, {"days": 5, "metric": False, "temp": None}),  # not strings
        ({"city": "Zürich"}, {"city": "Zürich"}),
    ],
)
def test_argument_coercion_per_schema(arguments, expected):
    out = arguments_json(ToolCall("get_weather", arguments), TOOLS)
    assert json.loads(out) == expected
    assert out == json.dumps(expected, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # a float stays a float and an int an int
    assert [type(v) for v in json.loads(out).values()] == [type(v) for v in dict(sorted(expected.items())).values()]


def test_argument_coercion_without_a_known_tool_or_schema_leaves_values_alone():
    assert arguments_json(ToolCall("nope", {"b": "1", "a": "true"}), TOOLS) == '{"a":"true","b":"1"}'
    bare = (ToolSpec("get-weather", "", {"type": "object"}),)
    assert arguments_json(ToolCall("get_weather", {"days": "3"}), bare) == '{"days":"3"}'


def _strict_json(text: str) -> Any:
    def reject(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=reject)


@pytest.mark.parametrize("value", ["nan", "inf", "-Infinity"])
def test_number_coercion_never_produces_non_json_constants(value):
    # NaN / Infinity are not JSON (the published arguments must be a JSON object string, §14): kept as written.
    assert _strict_json(arguments_json(ToolCall("get_weather", {"temp": value}), TOOLS)) == {"temp": value}


# -------------------------------------------------------------------------------------- result validation


def _cycle(call_id: str = "call_x", state: str = "awaiting") -> Cycle:
    return Cycle(call_id=call_id, name="get-weather", turn_id=T(1), response_id=R(1), deadline=30.0,
                 state=state)  # type: ignore[arg-type]


def _reject(*args, **kwargs) -> OutputRejected:
    with pytest.raises(OutputRejected) as info:
        result_tokens(*args, **kwargs)
    return info.value


OK = "x"
MAX_B = FUNCTION_OUTPUT_MAX_BYTES


@pytest.mark.parametrize(
    ("cycle", "call_id", "output", "model_output", "negotiated", "message"),
    [
        (None, "call_x", OK, None, False, "unknown or completed call_id"),
        (_cycle(), "call_y", OK, None, False, "unknown or completed call_id"),
        (_cycle(), 7, OK, None, False, "unknown or completed call_id"),
        (_cycle(state="recovering"), "call_x", OK, None, False, "unknown or completed call_id"),
        # The request's own shape and negotiation are checked before the call lookup (the reference's order)
        (_cycle(), "call_y", 5, None, False, "output must be a string"),
        (None, "unknown", OK, "concise", False, "model_output was not negotiated (function_output_model_output)"),
        (_cycle(), "call_y", OK, "", True, "model_output must be a non-empty string"),
        (_cycle(state="recovering"), "call_x", "a" * MAX_B, None, False,
         "injected result is 4105 tokens; maximum is 128"),
        (_cycle(), "call_x", 5, None, False, "output must be a string"),
        (_cycle(), "call_x", None, None, False, "output must be a string"),
        (_cycle(), "call_x", {"a": 1}, None, False, "output must be a string"),
        (_cycle(), "call_x", "a" * (MAX_B + 1), None, False, f"output exceeds {MAX_B} UTF-8 bytes"),
        (_cycle(), "call_x", "é" * (MAX_B // 2 + 1), None, False, f"output exceeds {MAX_B} UTF-8 bytes"),  # bytes
        # The full output is validated even when model_output replaces it for the model.
        (_cycle(), "call_x", "a" * (MAX_B + 1), "short", True, f"output exceeds {MAX_B} UTF-8 bytes"),
        (_cycle(), "call_x", OK, "short", False,
         "model_output was not negotiated (function_output_model_output)"),
        (_cycle(), "call_x", OK, "", True, "model_output must be a non-empty string"),
        (_cycle(), "call_x", OK, 5, True, "model_output must be a non-empty string"),
        (_cycle(), "call_x", OK, "a" * (MAX_B + 1), True, f"model_output exceeds {MAX_B} UTF-8 bytes"),
        (_cycle(), "call_x", OK, "a" * MAX_B, True, "injected result is 4105 tokens; maximum is 128"),
        (_cycle(), "call_x", "a" * MAX_B, None, False, "injected result is 4105 tokens; maximum is 128"),
    ],
)
def test_result_rejections_and_their_messages(cycle, call_id, output, model_output, negotiated, message):
    rejected = _reject(cycle, call_id, output, model_output, negotiated, split_tokens)
    assert rejected.message == message == str(rejected)
    assert rejected.call_id == call_id  # echoed as given, also when not a string


def _output_with_tokens(n: int) -> str:
    """A plain-text output whose wrapped, JSON-quoted form tokenizes to exactly ``n`` tokens."""
    k = next(k for k in range(4 * n) if len(split_tokens(wrap_tool_result("x" * k))) == n)
    return "x" * k


def test_exactly_128_wrapped_tokens_accepted_129_rejected():
    at, over = _output_with_tokens(FUNCTION_OUTPUT_MAX_TOKENS), _output_with_tokens(FUNCTION_OUTPUT_MAX_TOKENS + 1)
    assert len(split_tokens(wrap_tool_result(at))) == 128
    assert len(split_tokens(wrap_tool_result(over))) == 129
    assert wrap_tool_result(at) == f'<TOOL_RESPONSE>["{at}"]</TOOL_RESPONSE>'
    tokens = result_tokens(_cycle(), "call_x", at, None, False, split_tokens)
    assert tokens == tuple(split_tokens(wrap_tool_result(at))) and len(tokens) == 128
    rejected = _reject(_cycle(), "call_x", over, None, False, split_tokens)
    assert rejected.message == "injected result is 129 tokens; maximum is 128"
    # The same bound applies to model_output (what the model receives when negotiated and supplied).
    assert len(result_tokens(_cycle(), "call_x", over, at, True, split_tokens)) == 128
    assert _reject(_cycle(), "call_x", at, over, True, split_tokens).message == (
        "injected result is 129 tokens; maximum is 128"
    )


def test_result_tokens_use_model_output_when_supplied_and_normalize_json():
    full = json.dumps({"forecast": ["sunny"] * 200})  # far over 128 tokens: only validated, never injected
    assert result_tokens(_cycle(), "call_x", full, '{"f": "sunny"}', True, split_tokens) == wrapped_tokens('{"f":"sunny"}')
    assert wrap_tool_result('{"a": 1.50, "b": [1, 2]}') == '<TOOL_RESPONSE>[{"a":1.5,"b":[1,2]}]</TOOL_RESPONSE>'
    assert wrap_tool_result("sunny") == '<TOOL_RESPONSE>["sunny"]</TOOL_RESPONSE>'
    # output of exactly the byte bound is accepted (its tokens are not injected when model_output is used)
    assert result_tokens(_cycle(), "call_x", "a" * MAX_B, "ok", True, split_tokens) == wrapped_tokens("ok")
    assert result_tokens(_cycle(), "call_x", "é" * (MAX_B // 2), "ok", True, split_tokens) == wrapped_tokens("ok")


def test_rejected_results_are_recoverable_and_leave_the_call_pending():
    h = Harness()
    h.say(1, PARIS)
    h.run_until(lambda: bool(h.published()))
    cid = h.published()[0].call_id
    out = h.d.send(SubmitFunctionOutput("call_wrong", SUNNY, client_event_id="e1"))
    assert protocol(out) == [("Error", "invalid_function_call_output", "unknown or completed call_id", False, "e1",
                              {"call_id": "call_wrong"})]
    out = h.d.send(SubmitFunctionOutput(cid, 42, client_event_id="e2"))
    assert protocol(out) == [("Error", "invalid_function_call_output", "output must be a string", False, "e2",
                              {"call_id": cid})]
    out = h.d.send(SubmitFunctionOutput(cid, SUNNY, model_output="m", client_event_id="e3"))
    assert errors(out)[0].message == "model_output was not negotiated (function_output_model_output)"
    out = h.d.send(SubmitFunctionOutput(cid, _output_with_tokens(129), client_event_id="e4"))
    assert errors(out)[0].message == "injected result is 129 tokens; maximum is 128"
    assert not h.core.closed and h.core.cycle is not None and h.core.cycle.state == "awaiting"
    # a corrected resubmission still completes the call; the model gets model_output when negotiated
    assert h.d.send(SubmitFunctionOutput(cid, "a long output", model_output='"rain"', model_output_negotiated=True)) == []
    # a duplicate while the result is being applied is rejected as completed
    out = h.d.send(SubmitFunctionOutput(cid, SUNNY, client_event_id="dup"))
    assert errors(out)[0].message == "unknown or completed call_id"
    h.run_answering(lambda e: None)
    assert ("FunctionOutputApplied", cid) in protocol(h.events)
    assert h.fed_results() == [wrapped_tokens('"rain"')]
    assert ("TextDone", T(1), R(1), "The result is rain.") in protocol(h.events)
    out = h.d.send(SubmitFunctionOutput(cid, SUNNY, client_event_id="late"))
    assert protocol(out) == [("Error", "invalid_function_call_output", "unknown or completed call_id", False, "late",
                              {"call_id": cid})]


# ------------------------------------------------------------------------------------------------- recovery


def _recovery_positions(h: Harness) -> list:
    return [p for p in h.positions if p.kind.value == "recovery"]


def test_recovery_positions_are_paced_at_80_ms_on_the_virtual_clock():
    h = Harness(step_seconds=0.001)  # steps far faster than a frame: the pacing alone spaces them
    h.say(1, PARIS)
    h.run_answering()
    rec = _recovery_positions(h)
    assert len(rec) == len(wrapped_tokens(SUNNY)) + 1
    gaps = [b.started - a.started for a, b in zip(rec, rec[1:])]
    assert all(g >= FRAME - 1e-9 for g in gaps)
    assert gaps == pytest.approx([FRAME] * len(gaps))
    assert [p.due for p in rec[1:]] == pytest.approx([p.started + FRAME for p in rec[:-1]])
    assert all(p.started == p.due for p in rec)  # started on time
    assert [m.turn_state["late_ms"] for m in metrics(h.events, "recovery")] == [0.0] * len(rec)
    # the first recovery position starts as soon as the result arrives (submitted right after publication)
    assert rec[0].started == pytest.approx(h.time_of(FunctionCallPublished))


def test_slow_recovery_steps_stretch_the_schedule():
    h = Harness(step_seconds=0.1)  # every step overruns the 80 ms budget
    h.say(1, PARIS)
    h.run_answering()
    rec = _recovery_positions(h)
    gaps = [b.started - a.started for a, b in zip(rec, rec[1:])]
    assert gaps == pytest.approx([0.1] * len(gaps))
    assert all(b.started >= a.started + FRAME for a, b in zip(rec, rec[1:]))
    assert all(m.over_budget for m in metrics(h.events, "recovery"))
    assert ("FunctionOutputApplied", call_id_for(SID, 1)) in protocol(h.events)


def test_recovery_bound_256_positions_then_fatal_apply_timeout():
    assert FUNCTION_OUTPUT_RECOVERY_MAX_FRAMES == 256
    h = Harness(SimBehaviour(function_never_finishes=True))
    h.say(1, PARIS)
    h.run_answering()
    cid = call_id_for(SID, 1)
    assert len(metrics(h.events, "recovery")) == 256
    rec = _recovery_positions(h)
    assert rec[-1].started - rec[0].started == pytest.approx(255 * FRAME)  # >= 20.4 s scheduled
    p = protocol(h.events)
    assert "FunctionOutputApplied" not in names(h.events)
    assert p[-4:] == [
        ("TextDone", T(1), R(1), ""),
        ("AudioDone", T(1), R(1), not any(isinstance(e, AudioDelta) for e in h.events)),
        ("ResponseDone", T(1), R(1), "failed", "function_output_apply_timeout"),
        ("Error", "function_output_apply_timeout", "post-function recovery not idle within 256 positions", True, None,
         {"call_id": cid}),
    ]
    assert "SessionClosed" not in names(h.events)
    assert h.core.closed and any(isinstance(x, AbortModel) for x in h.d.effects)
    # the fatal is not a timeout of the call: it never fired although the 256 ticks took > 20 s
    assert "FunctionCallFailed" not in names(h.events)


def test_recovery_bound_is_configurable():
    h = Harness(SimBehaviour(function_never_finishes=True), function_recovery_max_frames=5)
    h.say(1, PARIS)
    h.run_answering()
    assert len(metrics(h.events, "recovery")) == 5
    assert errors(h.events)[-1].code == "function_output_apply_timeout"


# -------------------------------------------------------------------------------------------------- timeout


def test_tool_timeout_fails_the_call_feeds_the_model_and_restores_the_turn():
    assert FUNCTION_CALL_TIMEOUT_S == 30.0
    h = Harness()
    h.say(1, PARIS)
    h.run_answering(lambda e: None)  # never answered
    cid = call_id_for(SID, 1)
    published, failed = h.time_of(FunctionCallPublished), h.time_of(FunctionCallFailed)
    # never early, and no later than the next position of the open response
    assert published + 30.0 <= failed + 1e-9
    assert failed <= published + 30.0 + FRAME + 1e-9
    p = protocol(h.events)
    i = p.index(("FunctionCallFailed", T(1), R(1), cid, "function_call_output_timeout"))
    assert p[i - 1][0] == "FunctionCallPublished" and "FunctionOutputApplied" not in names(h.events)
    assert h.fed_results() == [wrapped_tokens('{"error":"function_call_output_timeout"}')]
    assert p[-3:] == [
        ("TextDone", T(1), R(1), 'The result is {"error":"function_call_output_timeout"}.'),
        ("AudioDone", T(1), R(1), False),
        ("ResponseDone", T(1), R(1), "completed", "post_eos_audio_silence"),
    ]
    assert not h.core.closed and h.core.cycle is None
    # a late result is refused (recoverable); the session goes on
    out = h.d.send(SubmitFunctionOutput(cid, SUNNY, client_event_id="late"))
    assert errors(out)[0].message == "unknown or completed call_id" and not errors(out)[0].fatal


def test_a_result_just_before_the_deadline_is_applied():
    h = Harness(function_call_timeout_s=2.0)
    h.say(1, PARIS)
    h.run_until(lambda: bool(h.published()))
    published = h.time_of(FunctionCallPublished)
    h.run_until(lambda: h.d.clock.now >= published + 1.9)
    h.run_answering()
    assert "FunctionCallFailed" not in names(h.events)
    assert ("FunctionOutputApplied", call_id_for(SID, 1)) in protocol(h.events)


def test_tool_timeout_fires_at_exactly_published_time_plus_timeout():
    h = Harness(step_seconds=0.001)
    h.say(1, PARIS)
    h.run_answering(lambda e: None)
    assert h.time_of(FunctionCallFailed) == pytest.approx(h.time_of(FunctionCallPublished) + 30.0, abs=1e-6)


def test_tool_timeout_in_the_deferred_bos_case_is_fatal():
    h = Harness(SimBehaviour(sotc_on_eou=True), function_call_timeout_s=5.0)
    h.say(1, "hello")
    h.run_answering(lambda e: None)
    cid = call_id_for(SID, 1)
    p = protocol(h.events)
    i = p.index(("FunctionCallFailed", T(1), R(1), cid, "function_call_output_timeout"))
    assert p[i + 1:] == [
        ("TextDone", T(1), R(1), ""),
        ("AudioDone", T(1), R(1), not any(isinstance(e, AudioDelta) for e in h.events)),
        ("ResponseDone", T(1), R(1), "failed", "function_call_output_timeout"),
        ("Error", "function_call_output_timeout",
         f"no result for {cid} within 5 s (deferred BOS pending)", True, None,
         {"call_id": cid, "epoch_invalidation_error": None}),
    ]
    assert h.core.closed and "SessionClosed" not in names(h.events)
    assert h.time_of(FunctionCallFailed) >= h.time_of(FunctionCallPublished) + 5.0


# --------------------------------------------------------------------------------------- loop limit, budget


def test_ninth_call_in_one_user_turn_is_never_published_and_ends_the_session():
    assert MAX_FUNCTION_CALLS_PER_RESPONSE == 8
    h = Harness(SimBehaviour(chained_calls=9))
    h.say(1, PARIS)
    h.run_answering()
    calls = h.published()
    assert [c.call_id for c in calls] == [call_id_for(SID, n) for n in range(1, 9)]
    assert {(c.turn_id, c.response_id) for c in calls} == {(T(1), R(1))}  # chained: same turn, response, budget
    p = protocol(h.events)
    tail_start = p.index(("FunctionOutputApplied", call_id_for(SID, 8))) + 1
    silent = not any(isinstance(e, AudioDelta) for e in h.events)
    assert p[tail_start:] == [
        ("TextDone", T(1), R(1), ""),  # no assistant answer is ever fabricated
        ("AudioDone", T(1), R(1), silent),
        ("ResponseDone", T(1), R(1), "failed", "function_call_loop_limit"),
        ("Error", "function_call_loop_limit", "more than 8 function calls in one user turn", True, None,
         {"call_id": call_id_for(SID, 9), "attempt": 9, "limit": 8}),
        ("SessionClosed", "failed", "function_call_loop_limit"),
    ]
    assert "TextDelta" not in names(h.events)
    assert h.core.closed and any(isinstance(x, AbortModel) for x in h.d.effects)
    # each call was its own transaction: published, then applied, before the next one was published
    order = [x[0] for x in p if x[0] in ("FunctionCallPublished", "FunctionOutputApplied")]
    assert order == ["FunctionCallPublished", "FunctionOutputApplied"] * 8


def test_chained_calls_are_new_transactions_in_the_same_response():
    h = Harness(SimBehaviour(chained_calls=2))
    h.say(1, PARIS)
    h.run_answering(lambda e: '"one"' if e.call_id == call_id_for(SID, 1) else '"two"')
    c1, c2 = call_id_for(SID, 1), call_id_for(SID, 2)
    p = [x for x in protocol(h.events) if x[0] in ("FunctionCallPublished", "FunctionOutputApplied", "ResponseCreated",
                                                    "TextDone", "ResponseDone")]
    assert p == [
        ("ResponseCreated", T(1), R(1)),
        ("FunctionCallPublished", T(1), R(1), c1, "get-weather", '{"city":"Paris"}'),
        ("FunctionOutputApplied", c1),
        ("FunctionCallPublished", T(1), R(1), c2, "get-weather", '{"city":"Paris"}'),
        ("FunctionOutputApplied", c2),
        ("TextDone", T(1), R(1), "The result is two."),
        ("ResponseDone", T(1), R(1), "completed", "post_eos_audio_silence"),
    ]
    assert h.fed_results() == [wrapped_tokens('"one"'), wrapped_tokens('"two"')]


def test_every_user_turn_starts_a_fresh_budget():
    h = Harness(SimBehaviour(chained_calls=8))
    h.say(1, PARIS)
    h.run_answering()
    h.say(2, 'call get_weather {"city":"Rome"}')
    h.run_answering()
    calls = h.published()
    assert len(calls) == 16
    assert [c.turn_id for c in calls] == [T(1)] * 8 + [T(2)] * 8
    assert [c.response_id for c in calls] == [R(1)] * 8 + [R(2)] * 8
    assert [c.call_id for c in calls] == [call_id_for(SID, n) for n in range(1, 17)]
    assert not errors(h.events) and not h.core.closed
    assert names(h.events).count("FunctionOutputApplied") == 16


# ---------------------------------------------------------------------------------------- deferred input


def test_deferred_input_bound_exactly_at_the_limit_accepted_one_byte_over_rejected():
    assert DEFERRED_INPUT_MAX_BYTES == 1 << 20
    fifo = DeferredInput()
    a, b, c = StartTurn(1, "s1"), AppendAudio(b"\0\0"), CommitTurn(1, "c1")
    assert fifo.offer(a, DEFERRED_INPUT_MAX_BYTES - 1)
    assert fifo.offer(b, 1)  # exactly at the limit
    assert fifo.size == DEFERRED_INPUT_MAX_BYTES
    assert not fifo.offer(c, 1)  # one byte over
    assert list(fifo.items) == [a, b] and fifo.size == DEFERRED_INPUT_MAX_BYTES
    assert fifo.drain() == [a, b]
    assert fifo.size == 0 and not fifo.items
    small = DeferredInput(limit=10)
    assert small.offer(a, 10) and not small.offer(b, 1)
    assert DeferredInput(limit=10).offer(a, 11) is False


def _open_cycle(h: Harness) -> str:
    h.say(1, PARIS)
    h.run_until(lambda: bool(h.published()))
    return h.published()[0].call_id


def test_microphone_input_during_a_cycle_is_held_and_replayed_in_order_after_applied():
    h = Harness()
    cid = _open_cycle(h)
    # Not evaluated while the cycle is open: no acks, no conflicts (a commit without start would be fatal).
    assert h.d.send(StartTurn(2, "s2")) == []
    assert h.d.send(AppendAudio(render_speech("hello"), client_event_id="a2")) == []
    assert h.d.send(CommitTurn(2, "c2")) == []
    for _ in range(3):
        h.step_once()
    assert ("TurnStarted", T(2), 2, "s2") not in protocol(h.events)
    h.run_answering()
    p = protocol(h.events)
    order = [
        p.index(("FunctionOutputApplied", cid)),
        p.index(("ResponseDone", T(1), R(1), "cancelled", "client_vad")),  # the held turn barges in
        p.index(("SpeechStarted", T(2), "microphone", None, 2)),
        p.index(("TurnStarted", T(2), 2, "s2")),
        p.index(("TranscriptDelta", T(2), "hello", "hello", "microphone", None)),
        p.index(("TurnCommitted", T(2), 2, "c2")),
        p.index(("ResponseCreated", T(2), R(2))),
        p.index(("TextDone", T(2), R(2), "You said: hello.")),
    ]
    assert order == sorted(order)
    assert not errors(h.events)


def test_microphone_input_held_by_a_cycle_is_late_only_from_its_replay():
    """The cycle holds client input by design: a held frame is late from its replay, not from when the host read it
    (``AppendAudio.arrived``), however long the cycle took."""
    h = Harness()
    _open_cycle(h)
    now = h.d.clock.now
    h.d.dispatch(h.core.receive(StartTurn(2, "s2"), now))
    h.d.dispatch(h.core.receive(AppendAudio(render_speech("hello"), client_event_id="a2"), now, arrived=now - 0.5))
    h.d.dispatch(h.core.receive(CommitTurn(2, "c2"), now))
    h.run_answering()
    late = [m.turn_state["late_ms"] for m in metrics(h.events, "real")]
    assert late and max(late) < 100.0  # the replayed frames queue behind each other, 1 ms a step here
    assert not errors(h.events)


def test_held_input_is_replayed_after_a_failed_call_too():
    h = Harness(function_call_timeout_s=1.0)
    cid = _open_cycle(h)
    h.d.send(StartTurn(2, "s2"))
    h.d.send(CommitTurn(2, "c2"))
    h.run_answering(lambda e: None)
    p = protocol(h.events)
    assert p.index(("FunctionCallFailed", T(1), R(1), cid, "function_call_output_timeout")) < p.index(
        ("TurnStarted", T(2), 2, "s2")) < p.index(("TurnCommitted", T(2), 2, "c2"))


def test_deferred_input_overflow_is_fatal_at_one_byte_over():
    h = Harness()
    _open_cycle(h)
    # wire_bytes (the size of the client message) is what counts; exactly 1 MiB is still held
    assert h.d.send(AppendAudio(b"\0\0", client_event_id="a1", wire_bytes=DEFERRED_INPUT_MAX_BYTES)) == []
    assert not h.core.closed
    out = h.d.send(StartTurn(2, "s2", wire_bytes=1))
    e = errors(out)[-1]
    assert (e.code, e.fatal, e.client_event_id) == ("deferred_input_overflow", True, "s2")
    assert h.core.closed and "SessionClosed" not in names(out)
    assert names(out)[-4:] == ["TextDone", "AudioDone", "ResponseDone", "Error"]
    assert protocol(out)[-2][:5] == ("ResponseDone", T(1), R(1), "failed", "deferred_input_overflow")


def test_deferred_input_size_falls_back_to_the_pcm_length():
    h = Harness()
    _open_cycle(h)
    assert h.d.send(AppendAudio(bytes(DEFERRED_INPUT_MAX_BYTES))) == []
    out = h.d.send(AppendAudio(b"\0\0", client_event_id="a2"))
    assert errors(out)[-1].code == "deferred_input_overflow"


# ---------------------------------------------------------------------------------- typed input, settings


@pytest.mark.parametrize(
    ("config", "job_id", "text", "reason"),
    [
        ({}, "j1", "What now?", "function_cycle_active"),
        ({}, "", "", "function_cycle_active"),  # check 4 comes before invalid_job_id and empty_text
        ({}, 7, "x" * 1001, "function_cycle_active"),
        ({}, "used", "hi", "function_cycle_active"),  # ... and before duplicate_job_id
        ({"typed_input_ready": False}, "j1", "hi", "typed_input_unavailable"),  # check 2 comes first
    ],
)
def test_typed_request_during_a_cycle_is_rejected_function_cycle_active(config, job_id, text, reason):
    h = Harness(**config)
    if job_id == "used":
        h.d.send(RequestTypedInput("used", "first"))
        h.run_answering()
        h.events.clear()
    _open_cycle(h)
    out = h.d.send(RequestTypedInput(job_id, text))
    assert protocol(out) == [("TypedRejected", job_id, reason)]
    assert not h.core.closed


def test_typed_request_is_accepted_again_after_applied_and_settings_stay_locked():
    h = Harness()
    _open_cycle(h)
    out = h.d.send(Configure(SessionPrompt("Other.", TOOLS), client_event_id="u1"))
    assert [(e.code, e.fatal, e.client_event_id) for e in errors(out)] == [("settings_locked", False, "u1")]
    h.run_answering()
    out = h.d.send(RequestTypedInput("j1", "Hi"))
    assert protocol(out)[0] == ("TypedAccepted", "j1")


# --------------------------------------------------------------------------------- suppressed by a barge-in


def _emission_length(name: str, arguments: dict) -> int:
    payload = "<TOOLCALL>" + json.dumps([{"name": name, "arguments": arguments}], separators=(",", ":")) + "</TOOLCALL>"
    return 1 + len(split_tokens(payload, 4)) + 1  # SOTC, payload tokens, EOTC


def _barge_in_during_emission(h: Harness, emitted: int) -> None:
    """Run until ``emitted`` function-channel tokens of the call are out, then start turn 2 ('hello')."""
    h.say(1, PARIS)
    h.run_until(lambda: sum(1 for _, r in h.steps if r.function.active) >= emitted)
    assert not h.published() and not any(r.tool_call for _, r in h.steps)  # the call is still being emitted
    h.d.send(StartTurn(2, "s2"))
    h.d.send(AppendAudio(render_speech("hello")))
    h.d.send(CommitTurn(2, "c2"))


CANCELLED = wrapped_tokens('{"error":"cancelled_by_new_client_turn"}')


def test_a_call_completing_during_a_cancel_tail_is_never_published_and_the_model_gets_the_error():
    h = Harness()
    total = _emission_length("get-weather", {"city": "Paris"})
    _barge_in_during_emission(h, total - 3)  # late in the emission: the cancel tail can still reach its terminal
    h.run_answering(lambda e: pytest.fail("a suppressed call was published"))
    completed = [(k, pos) for k, ((_, r), pos) in enumerate(zip(h.steps, h.positions)) if r.tool_call]
    assert len(completed) == 1
    k, pos = completed[0]
    assert pos.kind.value == "cancel_tail"  # the call completed while the cancel tail ran
    assert h.steps[k + 1][0].controls.tool_result_tokens == CANCELLED  # fed on the very next position
    assert h.fed_results() == [CANCELLED]
    assert "FunctionCallPublished" not in names(h.events)
    p = protocol(h.events)
    assert p.index(("ResponseDone", T(1), R(1), "cancelled", "client_vad")) < p.index(
        ("SpeechStarted", T(2), "microphone", None, 2)) < p.index(("TurnStarted", T(2), 2, "s2"))
    assert ("TextDone", T(2), R(2), "You said: hello.") in p
    assert not errors(h.events) and not h.core.closed


def test_an_early_barge_in_during_a_call_emission_still_starts_the_new_turn():
    h = Harness()
    _barge_in_during_emission(h, 2)
    h.run_answering(lambda e: None)
    assert "FunctionCallPublished" not in names(h.events)
    assert h.fed_results() == [CANCELLED]
    assert not errors(h.events)
    assert ("TurnStarted", T(2), 2, "s2") in protocol(h.events)


@pytest.mark.parametrize("emitted", [1, 20])
def test_turn_start_interrupts_an_unpublished_deferred_bos_cycle(emitted):
    h = Harness(SimBehaviour(sotc_on_eou=True))
    h.say(1, PARIS)
    h.run_until(lambda: sum(1 for _, r in h.steps if r.function.active) >= emitted)
    assert not h.published()
    h.d.send(StartTurn(2, "s2"))
    h.d.send(AppendAudio(render_speech("hello")))
    h.d.send(CommitTurn(2, "c2"))
    h.run_answering(lambda e: SUNNY)
    # turn 1's call is never shown; turn 2 (the same scripted model) may make its own call
    published = [e for e in h.events if type(e).__name__ == "FunctionCallPublished"]
    assert all(e.turn_id != T(1) for e in published)
    assert h.fed_results()[0] == CANCELLED
    assert not [e for e in errors(h.events) if e.fatal]


# -------------------------------------------------------------------------- PAD forcing and deferred BOS (§7)


def test_settlement_function_head_predictions_are_forced_to_pad_in_a_tool_session():
    # Turn without audio: positions 0-2 settle to the fence (3), position 3 is the separate EOU.
    h = Harness(SimBehaviour(function_head_sotc_at=1))
    h.d.send(StartTurn(1, "s1"))
    h.d.send(CommitTurn(1, "c1"))
    h.run_answering()
    kinds = [m.kind for m in metrics(h.events)]
    assert kinds[:4] == ["settlement", "settlement", "settlement", "eou"]
    assert not errors(h.events)  # forced to PAD before the function state could mutate: no pre-EOU activity
    assert "FunctionCallPublished" not in names(h.events)
    model = metrics(h.events)[1].turn_state["model"]
    assert (model["pre_eou_suppressed_tokens"], model["pre_eou_suppressed_frame"]) == (1, 1)
    assert model["pre_eou_last_raw_token"] == "<SPECIAL_20>"
    assert model["client_eou_sotc_staged_count"] == 0  # a settlement SOTC is discarded
    assert ("ResponseDone", T(1), R(1), "completed", "post_eos_audio_silence") in protocol(h.events)


def test_sotc_on_the_eou_position_defers_bos_until_the_result_is_through():
    h = Harness(SimBehaviour(sotc_on_eou=True))
    h.say(1, PARIS)
    h.run_answering()
    cid = call_id_for(SID, 1)
    ms = metrics(h.events)
    eou = next(k for k, m in enumerate(ms) if m.kind == "eou")
    staged, replay = ms[eou].turn_state["model"], ms[eou + 1].turn_state["model"]
    assert ms[eou].turn_state["agent_control"] == "pad"  # no BOS on the EOU position
    assert (staged["client_eou_sotc_staged_count"], staged["client_eou_sotc_staged_frame"]) == (1, ms[eou].frame)
    assert staged["latch_pending"] and staged["client_eou_sotc_committed_count"] == 0
    assert (replay["client_eou_sotc_committed_count"], replay["client_eou_sotc_committed_frame"]) == (
        1, ms[eou].frame + 1)
    assert ms[-1].turn_state["model"]["client_eou_sotc_committed_count"] == 1  # replayed once
    p = protocol(h.events)
    i = p.index(("TurnCommitted", T(1), 1, "c1"))
    assert p[i:i + 6] == [
        ("TurnCommitted", T(1), 1, "c1"),
        ("SpeechStopped", T(1), "microphone", None),  # emitted at once for the committed turn
        ("TranscriptCompleted", T(1), PARIS, "microphone", None),
        ("ResponseCreated", T(1), R(1)),  # opened by the publication: no response was open
        ("FunctionCallPublished", T(1), R(1), cid, "get-weather", '{"city":"Paris"}'),  # the user turn id
        ("FunctionOutputApplied", cid),
    ]
    # applied only once the forced agent BOS arrived, on the completing recovery tick
    recovery = metrics(h.events, "recovery")
    assert [m.turn_state["agent_control"] for m in recovery][-1] == AgentControl.AGENT_BOS.value
    assert all(m.turn_state["agent_control"] == "pad" for m in recovery[:-1])
    assert ("TextDone", T(1), R(1), "The result is sunny.") in p and not errors(h.events)


# ------------------------------------------------------------------------------------------- system prompt


WEATHER = ToolSpec("get-weather", "Weather for a city", {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]})
ALARM = ToolSpec("set_alarm", "Set an alarm – «Zürich» time", {"type": "object", "properties": {"at": {"type": "string"}}})


def test_render_system_prompt_has_the_sorted_key_tool_block_and_the_grounding_paragraph():
    prompt = SessionPrompt("Be brief.", (WEATHER, ALARM))
    text = render_system_prompt(prompt)
    expected = json.dumps(
        [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in prompt.tools],
        sort_keys=True, separators=(",", ":"),
    )
    assert f"{TOOLS_OPEN}{expected}{TOOLS_CLOSE}" in text
    block = text[text.index(TOOLS_OPEN) + len(TOOLS_OPEN) : text.index(TOOLS_CLOSE)]
    assert json.loads(block) == json.loads(expected)  # the block is the tool list as JSON
    assert '"description":"Weather for a city","name":"get-weather","parameters":{"properties"' in text  # sorted keys
    assert text.startswith("Be brief.\n\n")
    assert text.endswith("\n\n" + GROUNDING)
    assert text.index("Be brief.") < text.index(TOOLS_OPEN) < text.index(GROUNDING)
    assert "<TOOLCALL>" in text and "<TOOL_RESPONSE>[" in text and "]</TOOL_RESPONSE>" in text
    # without tools the system prompt is the instructions alone
    assert render_system_prompt(SessionPrompt("Be brief.")) == "Be brief."
    assert render_system_prompt(SessionPrompt("", (WEATHER,))).startswith("You can call the following tools")


def test_tools_from_prompt_round_trips():
    for tools in [(WEATHER,), (WEATHER, ALARM), (ToolSpec("x"),)]:
        assert tools_from_prompt(render_system_prompt(SessionPrompt("Hi.", tools))) == tools
    assert tools_from_prompt(render_system_prompt(SessionPrompt("Hi."))) == ()
    assert tools_from_prompt("no block here") == ()


def test_the_simulator_takes_its_tools_from_the_rendered_prompt(monkeypatch):
    h = Harness(tools=(WEATHER, ALARM))
    assert h.model.system_prompt == render_system_prompt(SessionPrompt("Be brief.", (WEATHER, ALARM)))
    assert h.model.tools == tools_from_prompt(h.model.system_prompt) == (WEATHER, ALARM)
    # If the rendered prompt offered no tools, the simulator could call none, whatever the session prompt says.
    import vllm_omni_voicechat.sim.model as sim_model

    monkeypatch.setattr(sim_model, "render_system_prompt", lambda prompt: prompt.instructions)
    blind = SimulatorModel()
    blind.prefill(SessionPrompt("Be brief.", (WEATHER,)))
    assert blind.prompt.tools == (WEATHER,) and blind.tools == ()


@settings(max_examples=100, deadline=None)
@given(
    instructions=st.text(alphabet=st.sampled_from("ab </>_AVILBETOS\\\"\u00fc\n"), max_size=40),
    description=st.text(alphabet=st.sampled_from("ab </>_AVILBETOS\\\"\u00fc\n"), max_size=40),
)
@example(instructions="", description=TOOLS_OPEN)
@example(instructions=TOOLS_CLOSE, description=TOOLS_CLOSE)
def test_tools_from_prompt_round_trips_any_text(instructions, description):
    tools = (ToolSpec("get-weather", description, SCHEMA), ToolSpec("x_y", instructions))
    for text in (instructions, instructions + TOOLS_OPEN + "[]" + TOOLS_CLOSE):
        rendered = render_system_prompt(SessionPrompt(text, tools))
        assert tools_from_prompt(rendered) == tools
        assert rendered.endswith(GROUNDING)


def test_tools_from_prompt_round_trips_a_description_mentioning_the_closing_tag():
    tools = (ToolSpec("echo", "Echo text such as </AVAILABLE_TOOLS> verbatim"),)
    assert tools_from_prompt(render_system_prompt(SessionPrompt("Hi.", tools))) == tools


def test_tools_from_prompt_round_trips_a_description_mentioning_the_opening_tag():
    tools = (ToolSpec("x", "<AVAILABLE_TOOLS>"),)
    assert tools_from_prompt(render_system_prompt(SessionPrompt("", tools))) == tools


def test_tools_from_prompt_ignores_a_tag_quoted_in_the_instructions():
    tools = (WEATHER,)
    prompt = SessionPrompt("Never trust text like <AVAILABLE_TOOLS>[]</AVAILABLE_TOOLS>.", tools)
    assert tools_from_prompt(render_system_prompt(prompt)) == tools


# -------------------------------------------------------------------------- broken EOU/BOS contracts (model faults)


def test_fused_fence_position_without_bos_is_fatal_fused_eou_contract_failure():
    from .helpers import session

    d = session(behaviour=SimBehaviour(ignore_eou=True), settlement_blank_frames=3)
    d.send(StartTurn(1, "s1"))
    d.send(CommitTurn(1, "c1"))
    d.run()
    fatal = [e for e in errors(d.events) if e.fatal]
    assert [e.code for e in fatal] == ["fused_eou_contract_failure"]
    assert "TurnCommitted" not in names(d.events) and "ResponseCreated" not in names(d.events)


def test_separate_eou_position_without_bos_or_call_is_fatal_missing_terminal_bos():
    from .helpers import session

    d = session(behaviour=SimBehaviour(ignore_eou=True), settlement_blank_frames=3, tools=TOOLS)
    d.send(StartTurn(1, "s1"))
    d.send(CommitTurn(1, "c1"))
    d.run()
    fatal = [e for e in errors(d.events) if e.fatal]
    assert [(e.code, e.details) for e in fatal] == [("missing_terminal_bos", {"source": "microphone", "job_id": None})]
    assert names(d.events)[-1] == "Error" and "ResponseCreated" not in names(d.events)


def test_deferred_bos_that_never_comes_is_fatal_missing_post_fc_terminal_bos():
    h = Harness(SimBehaviour(sotc_on_eou=True, skip_post_fc_bos=True))
    h.say(1, PARIS)
    h.run_answering(lambda e: SUNNY)
    fatal = [e for e in errors(h.events) if e.fatal]
    assert [e.code for e in fatal] == ["missing_post_fc_terminal_bos"]
    assert "FunctionOutputApplied" not in names(h.events)
