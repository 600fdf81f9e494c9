"""The thinker's control state machine (torch-free): EOU/BOS fence, agent EOS, PAD forcing, SOTC latch, calls and
tool-result injection, on token ids with a fake decoder."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.model.port import (
    IDLE_FUNCTION,
    AgentControl,
    BoundaryPhase,
    FunctionState,
    PositionControls,
    RnntEvidence,
    ToolCall,
)
from vllm_omni_voicechat.model.prompt import parse_tool_call
from vllm_omni_voicechat.omni.thinker.controls import SpecialIds, ThinkerSession

IDS = SpecialIds(pad=12, bos=1, eos=2, sotc=20, eotc=21, eotr=22)
NAMES = {12: "<SPECIAL_12>", 1: "<s>", 2: "</s>", 20: "<SPECIAL_20>", 21: "<SPECIAL_21>", 22: "<SPECIAL_22>"}
WORDS = {1000 + i: w for i, w in enumerate(["Hi", " there", ".", "<TOOLCALL>", '[{"name":"clock",', '"arguments":{}}]',
                                            "</TOOLCALL>", "<TOOL_RESPONSE>[", '"noon"', "]</TOOL_RESPONSE>"])}
TOK = {v: k for k, v in WORDS.items()}
BLANK = RnntEvidence(True, 1, "", False)
P, C = IDS.pad, PositionControls()


def decode(token_id: int) -> str:
    return NAMES.get(token_id) or WORDS[token_id]


def session(**kw) -> ThinkerSession:
    return ThinkerSession(IDS, decode, **kw)


def step(s: ThinkerSession, controls=C, raw_text=P, raw_fn=P, rnnt=BLANK, tools=()):
    s.begin(controls, rnnt, tool_result_ids=tools)
    return s.finish(raw_text, raw_fn)


def blanks(n: int) -> RnntEvidence:
    return RnntEvidence(True, n, "", False)


def test_eou_now_forces_bos_then_text_then_agent_eos_then_the_tail_ends_the_response():
    s = session(tail_positions=2)
    text, fn, r = step(s, PositionControls(eou_now=True), raw_text=P)
    assert (text, fn) == (IDS.bos, P)
    assert (r.agent.control, r.agent.token_id, r.eou_consumed, r.fence_blank_count) == (AgentControl.AGENT_BOS, 1,
                                                                                        True, None)
    assert (r.boundary.phase, r.boundary.started, r.boundary.ended) == (BoundaryPhase.RESPONDING, True, False)
    assert r.function == IDLE_FUNCTION and r.audio == b""
    _, _, r = step(s, raw_text=TOK["Hi"])
    assert (r.agent.control, r.agent.delta, r.boundary.phase) == (AgentControl.TEXT, "Hi", BoundaryPhase.RESPONDING)
    _, _, r = step(s, PositionControls(force_text_pad=True), raw_text=TOK[" there"])
    assert (r.agent.control, r.agent.delta) == (AgentControl.PAD, "")
    text, _, r = step(s, PositionControls(agent_eos=True), raw_text=TOK[" there"])
    assert text == IDS.eos and r.agent.control is AgentControl.AGENT_EOS
    assert r.boundary.phase is BoundaryPhase.TAIL_DRAINING and not r.boundary.ended
    _, _, r = step(s, raw_text=TOK["Hi"])  # the tail drains whatever the model says
    assert (r.boundary.phase, r.boundary.ended) == (BoundaryPhase.TAIL_DRAINING, False)
    _, _, r = step(s)
    assert (r.boundary.phase, r.boundary.ended, r.boundary.reason) == (BoundaryPhase.COMPLETE, True,
                                                                       "post_eos_audio_silence")
    _, _, r = step(s)
    assert r.boundary.phase is BoundaryPhase.IDLE
    t = r.telemetry
    assert (t["agent_bos_forced"], t["agent_eos_forced"], t["text_pad_forced"]) == (1, 1, 1)
    assert (t["last_eou_frame"], t["last_eos_forced_frame"], t["last_pad_forced_frame"], t["thinker_frame"]) == (
        0, 3, 2, 6)


def test_an_armed_fence_fires_on_the_position_whose_blank_count_reaches_it_and_cancel_disarms_it():
    s = session()
    _, _, r = step(s, PositionControls(eou_at_fence=3), rnnt=blanks(1))
    assert not r.eou_consumed and r.agent.control is AgentControl.PAD
    _, _, r = step(s, rnnt=blanks(2))
    assert not r.eou_consumed
    text, _, r = step(s, rnnt=blanks(3))
    assert text == IDS.bos and r.eou_consumed and r.fence_blank_count == 3 and r.boundary.started
    s = session()
    step(s, PositionControls(eou_at_fence=2), rnnt=blanks(1))
    _, _, r = step(s, PositionControls(cancel_eou=True), rnnt=blanks(5))
    assert not r.eou_consumed and r.agent.control is AgentControl.PAD


def test_eou_is_not_consumed_while_the_agent_speaks_and_model_eos_while_listening_is_pad():
    s = session()
    _, _, r = step(s, raw_text=IDS.eos)
    assert r.agent.control is AgentControl.PAD and r.boundary.phase is BoundaryPhase.IDLE
    step(s, raw_text=IDS.bos)  # a self-started response
    _, _, r = step(s, PositionControls(eou_now=True), raw_text=TOK["Hi"])
    assert not r.eou_consumed and r.agent.control is AgentControl.TEXT
    _, _, r = step(s, raw_text=IDS.bos)  # no nested BOS
    assert r.agent.control is AgentControl.PAD and not r.boundary.started


def test_agent_eos_is_latched_until_a_response_position_takes_it():
    s = session(tail_positions=0)
    step(s, PositionControls(eou_now=True))
    text, _, r = step(s, PositionControls(agent_eos=True), raw_text=TOK["Hi"])
    assert text == IDS.eos and r.boundary.ended and r.boundary.phase is BoundaryPhase.COMPLETE
    _, _, r = step(s, PositionControls(agent_eos=True))  # not responding: nothing to end
    assert r.agent.control is AgentControl.PAD and r.boundary.phase is BoundaryPhase.IDLE


def call_tokens() -> list[int]:
    return [IDS.sotc, TOK["<TOOLCALL>"], TOK['[{"name":"clock",'], TOK['"arguments":{}}]'], TOK["</TOOLCALL>"], IDS.eotc]


def test_a_call_then_its_result_injected_one_token_per_position_with_the_text_held_then_eotr():
    s = session()
    step(s, PositionControls(eou_now=True))
    states = []
    for raw in call_tokens():
        _, fn, r = step(s, raw_fn=raw, raw_text=TOK["Hi"])
        assert fn == raw
        states.append((r.function.token, r.function.active, r.function.awaiting_result))
    assert states == [("<SPECIAL_20>", True, False), ("<TOOLCALL>", True, False),
                      ('[{"name":"clock",', True, False), ('"arguments":{}}]', True, False),
                      ("</TOOLCALL>", True, False), ("<SPECIAL_21>", False, True)]
    assert r.tool_call == ToolCall("clock", {}, '<TOOLCALL>[{"name":"clock","arguments":{}}]</TOOLCALL>')
    assert r.function.busy
    result = [TOK["<TOOL_RESPONSE>["], TOK['"noon"'], TOK["]</TOOL_RESPONSE>"]]
    text, fn, r = step(s, raw_text=TOK["Hi"], raw_fn=P, tools=result)
    assert (text, fn) == (P, result[0]) and r.agent.control is AgentControl.PAD
    assert r.function == FunctionState(token="<TOOL_RESPONSE>[", raw_token=None, injecting=True, forced_tokens=2)
    step(s, raw_text=TOK["Hi"])
    text, fn, r = step(s, raw_text=TOK["Hi"])
    assert (text, fn) == (P, result[2])
    assert r.function == FunctionState(token="]</TOOL_RESPONSE>", awaiting_eotr=True)
    text, fn, r = step(s, raw_text=TOK["Hi"], raw_fn=TOK["Hi"])
    assert (text, fn) == (P, IDS.eotr) and r.function == FunctionState(token="<SPECIAL_22>", raw_token="Hi")
    assert not r.function.busy
    _, _, r = step(s, raw_text=TOK["Hi"])
    assert r.agent.delta == "Hi" and r.function == IDLE_FUNCTION
    assert r.telemetry["tool_tokens_injected"] == 3 and r.telemetry["last_injection_frame"] == 9


def test_pre_eou_predictions_are_forced_to_pad_and_an_sotc_on_the_eou_position_is_latched_then_replayed():
    s = session()
    _, fn, r = step(s, PositionControls(pre_eou=True), raw_fn=TOK["Hi"])
    assert fn == P and r.function == FunctionState(token=None, raw_token="Hi")
    assert r.telemetry["pre_eou_suppressed_tokens"] == 1 and r.telemetry["pre_eou_suppressed_frame"] == 0
    text, fn, r = step(s, PositionControls(eou_now=True, pre_eou=True), raw_fn=IDS.sotc)
    assert (text, fn) == (IDS.bos, P)
    assert r.function == FunctionState(token=None, raw_token="<SPECIAL_20>", latched=True) and r.function.busy
    _, fn, r = step(s, raw_fn=TOK["<TOOLCALL>"])  # the first post-BOS position takes the staged SOTC
    assert fn == IDS.sotc and r.function.active and not r.function.latched
    assert (r.telemetry["client_eou_sotc_staged_frame"], r.telemetry["client_eou_sotc_committed_frame"]) == (1, 2)


def test_an_eou_waits_while_the_function_channel_is_busy():
    s = session()
    step(s, raw_fn=IDS.sotc)  # the model started a call on its own
    _, _, r = step(s, PositionControls(eou_now=True))
    assert not r.eou_consumed and r.function.active


def test_parse_tool_call_takes_string_arguments_and_rejects_garbage():
    assert parse_tool_call('<TOOLCALL>[{"name":"f","arguments":"{\\"a\\":1}"}]</TOOLCALL>') == ToolCall(
        "f", {"a": 1}, '<TOOLCALL>[{"name":"f","arguments":"{\\"a\\":1}"}]</TOOLCALL>')
    assert parse_tool_call("<TOOLCALL>[nope</TOOLCALL>") is None


CONTROLS = st.builds(
    PositionControls,
    eou_now=st.booleans(), eou_at_fence=st.none() | st.integers(1, 4), cancel_eou=st.booleans(),
    agent_eos=st.booleans(), force_text_pad=st.booleans(), pre_eou=st.booleans(),
)
STEP = st.tuples(CONTROLS, st.sampled_from([P, IDS.bos, IDS.eos, *WORDS]), st.sampled_from([P, *call_tokens()]),
                 st.booleans(), st.lists(st.sampled_from(sorted(WORDS)), max_size=3))


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=40))
def test_invariants_and_reproducibility_over_random_control_sequences(steps):
    def run(s):
        out, blank = [], 0
        for controls, raw_text, raw_fn, is_blank, tools in steps:
            blank = blank + 1 if is_blank else 0
            plan = s.begin(controls, RnntEvidence(is_blank, blank, "", not is_blank), tool_result_ids=tools)
            text, fn, r = s.finish(raw_text, raw_fn)
            if plan.forced_text is not None and plan.forced_text == text:
                assert r.agent.token_id == plan.forced_text
            if plan.forced_function is not None:
                assert fn == plan.forced_function
            assert r.agent.token_id == text
            assert (r.agent.control is AgentControl.TEXT) == (text not in (IDS.pad, IDS.bos, IDS.eos))
            assert r.boundary.started == (text == IDS.bos) and (not r.eou_consumed or text == IDS.bos)
            assert r.function.token == (None if fn == IDS.pad else decode(fn))
            assert r.function.forced_tokens == len(s._inject) and r.function.injecting == bool(s._inject)
            assert r.fence_blank_count is None or (r.eou_consumed and r.fence_blank_count >= 1)
            json.dumps(r.telemetry)
            out.append((text, fn, r))
        return out

    s = session()
    first = run(s)
    s.reset()
    assert run(s) == first  # a reset session replays exactly (the abort path)
