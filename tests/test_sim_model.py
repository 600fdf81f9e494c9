"""The simulator model on its own, through the model port."""

from __future__ import annotations

import json

import pytest

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES, OUTPUT_FRAME_BYTES, SILENT_INPUT_FRAME
from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.model.port import (
    AgentControl,
    ModelError,
    ModelPort,
    PositionControls,
    PositionInput,
    SessionPrompt,
    ToolSpec,
)
from vllm_omni_voicechat.sim.model import EOTC, EOTR, SOTC, SimBehaviour, SimulatorModel

TOOLS = (ToolSpec("get-weather"),)


def frames(pcm: bytes) -> list[bytes]:
    pcm += bytes(-len(pcm) % INPUT_FRAME_BYTES)
    return [pcm[i : i + INPUT_FRAME_BYTES] for i in range(0, len(pcm), INPUT_FRAME_BYTES)]


def say(model: SimulatorModel, text: str, silence: int = 2) -> str:
    heard = ""
    for f in frames(render_speech(text)) + [SILENT_INPUT_FRAME] * silence:
        heard += model.step(PositionInput(f)).rnnt.text_delta
    return heard


def until_listening(model, controls=PositionControls(), limit=400):
    out = []
    for _ in range(limit):
        r = model.step(PositionInput(SILENT_INPUT_FRAME, controls, synthetic=True))
        out.append(r)
        controls = PositionControls()
        if r.boundary.ended:
            return out
    raise AssertionError("response never ended")


def test_is_a_model_port_and_hears_simulator_speech_word_by_word():
    m = SimulatorModel()
    assert isinstance(m, ModelPort)
    m.prefill(SessionPrompt())
    deltas = []
    for f in frames(render_speech("one two three")) + [SILENT_INPUT_FRAME] * 2:
        r = m.step(PositionInput(f))
        if r.rnnt.text_delta:
            deltas.append(r.rnnt.text_delta)
    assert deltas == ["one", " two", " three"]


def test_blank_count_grows_on_silence_and_resets_on_speech():
    m = SimulatorModel()
    counts = [m.step(PositionInput(SILENT_INPUT_FRAME)).rnnt.blank_count for _ in range(3)]
    assert counts == [1, 2, 3]
    r = m.step(PositionInput(frames(render_speech("hey"))[0]))
    assert (r.rnnt.blank, r.rnnt.blank_count) == (False, 0)


def test_eou_opens_a_response_that_speaks_the_reply_and_ends_after_its_tail():
    m = SimulatorModel(SimBehaviour(tail_positions=3))
    say(m, "good morning")
    bos = m.step(PositionInput(SILENT_INPUT_FRAME, PositionControls(eou_now=True), True))
    assert (bos.agent.control, bos.boundary.started, bos.eou_consumed) == (AgentControl.AGENT_BOS, True, True)
    rest = until_listening(m)
    text = "".join(r.agent.delta for r in rest)
    assert text == "You said: good morning."
    assert decode_speech(b"".join(r.audio for r in rest), 22_050) == text
    controls = [r.agent.control for r in rest]
    eos = controls.index(AgentControl.AGENT_EOS)
    assert len(rest) - eos - 1 == 3  # the acoustic tail
    assert rest[-1].boundary.reason == "post_eos_audio_silence"
    assert all(len(r.audio) == OUTPUT_FRAME_BYTES for r in rest)


def test_fence_request_fires_on_the_position_that_reaches_the_fence():
    m = SimulatorModel()
    say(m, "hi", silence=0)
    results = [m.step(PositionInput(SILENT_INPUT_FRAME, PositionControls(eou_at_fence=3), True)) for _ in range(3)]
    assert [r.eou_consumed for r in results] == [False, False, True]
    assert results[-1].fence_blank_count == 3 and results[-1].agent.control is AgentControl.AGENT_BOS


def test_agent_eos_request_cuts_the_reply_short():
    m = SimulatorModel()
    say(m, "please talk for a long long time")
    m.step(PositionInput(SILENT_INPUT_FRAME, PositionControls(eou_now=True)))
    rest = until_listening(m, PositionControls(agent_eos=True))
    assert rest[0].agent.control is AgentControl.AGENT_EOS
    assert len(rest) == 1 + 3


def test_tool_call_cycle_on_the_function_channel():
    m = SimulatorModel()
    m.prefill(SessionPrompt("", TOOLS))
    say(m, 'call get-weather {"city": "Paris"}')
    m.step(PositionInput(SILENT_INPUT_FRAME, PositionControls(eou_now=True)))
    tokens, call = [], None
    for _ in range(200):
        r = m.step(PositionInput(SILENT_INPUT_FRAME))
        assert r.agent.control is AgentControl.PAD
        tokens.append(r.function.token)
        if r.tool_call:
            call = r.tool_call
            assert r.function.awaiting_result and not r.function.active
            break
        assert r.function.active
    assert tokens[0] == SOTC and tokens[-1] == EOTC
    assert call.name == "get-weather" and call.arguments == {"city": "Paris"}
    assert "".join(tokens[1:-1]) == '<TOOLCALL>[{"name":"get-weather","arguments":{"city":"Paris"}}]</TOOLCALL>'
    # waiting for the result: idle PAD positions with awaiting_result
    r = m.step(PositionInput(SILENT_INPUT_FRAME))
    assert r.function.awaiting_result and r.function.busy
    result = ["<TOOL_RESPONSE>[", '"sunny"', "]</TOOL_RESPONSE>"]
    r = m.step(PositionInput(SILENT_INPUT_FRAME, PositionControls(tool_result_tokens=tuple(result))))
    assert r.function.injecting and r.function.token == result[0]
    seen = [r.function.token]
    while True:
        r = m.step(PositionInput(SILENT_INPUT_FRAME))
        seen.append(r.function.token)
        if r.function.token == EOTR:
            break
    assert seen == [*result, EOTR]
    rest = until_listening(m)
    assert "".join(x.agent.delta for x in rest) == "The result is sunny."


def test_chained_calls_and_a_cycle_that_never_finishes():
    m = SimulatorModel(SimBehaviour(chained_calls=2))
    m.prefill(SessionPrompt("", TOOLS))
    say(m, "call get-weather {}")
    m.step(PositionInput(SILENT_INPUT_FRAME, PositionControls(eou_now=True)))
    calls = 0
    controls = PositionControls()
    for _ in range(300):
        r = m.step(PositionInput(SILENT_INPUT_FRAME, controls))
        controls = PositionControls()
        if r.tool_call:
            calls += 1
            controls = PositionControls(tool_result_tokens=("1",))
        if r.agent.delta:
            break
    assert calls == 2
    stuck = SimulatorModel(SimBehaviour(function_never_finishes=True))
    stuck.prefill(SessionPrompt("", TOOLS))
    say(stuck, "call get-weather {}")
    stuck.step(PositionInput(SILENT_INPUT_FRAME, PositionControls(eou_now=True)))
    controls = PositionControls()
    for _ in range(150):
        r = stuck.step(PositionInput(SILENT_INPUT_FRAME, controls))
        controls = PositionControls(tool_result_tokens=("x",)) if r.tool_call else PositionControls()
    assert r.function.awaiting_eotr and r.function.busy


def test_sotc_on_the_eou_position_is_latched_replayed_once_and_bos_follows_the_result():
    m = SimulatorModel(SimBehaviour(sotc_on_eou=True))
    m.prefill(SessionPrompt("", TOOLS))
    say(m, "hello")
    eou = m.step(PositionInput(SILENT_INPUT_FRAME, PositionControls(eou_now=True)))
    assert eou.eou_consumed and eou.agent.control is AgentControl.PAD  # the agent turn is deferred
    assert eou.function.token is None and eou.function.latched and eou.function.busy  # staged, effective PAD
    assert eou.function.post_fc_bos_pending
    assert eou.telemetry["client_eou_sotc_staged_count"] == 1 and eou.telemetry["latch_pending"]
    nxt = m.step(PositionInput(SILENT_INPUT_FRAME))
    assert nxt.function.token == SOTC and nxt.function.active and not nxt.function.latched
    assert nxt.telemetry["client_eou_sotc_committed_count"] == 1
    assert nxt.telemetry["client_eou_sotc_committed_frame"] == eou.telemetry["client_eou_sotc_staged_frame"] + 1
    controls, bos = PositionControls(), None
    for _ in range(200):
        r = m.step(PositionInput(SILENT_INPUT_FRAME, controls))
        controls = PositionControls(tool_result_tokens=("x",)) if r.tool_call else PositionControls()
        assert r.telemetry["client_eou_sotc_committed_count"] == 1  # replayed once
        if r.agent.control is AgentControl.AGENT_BOS:
            bos = r
            break
    assert bos is not None and bos.boundary.started


def test_pre_eou_function_head_predictions_are_forced_to_pad():
    m = SimulatorModel(SimBehaviour(function_head_sotc_at=1))
    m.prefill(SessionPrompt("", TOOLS))
    m.step(PositionInput(SILENT_INPUT_FRAME))
    r = m.step(PositionInput(SILENT_INPUT_FRAME, PositionControls(pre_eou=True), True))
    assert r.function.token is None and not r.function.busy
    assert r.telemetry["pre_eou_suppressed_tokens"] == 1 and r.telemetry["pre_eou_suppressed_frame"] == 1
    free = SimulatorModel(SimBehaviour(function_head_sotc_at=0))
    free.prefill(SessionPrompt("", TOOLS))
    assert free.step(PositionInput(SILENT_INPUT_FRAME)).function.token == SOTC  # not pre-EOU: effective


def test_legacy_mode_takes_the_turn_after_n_blanks():
    m = SimulatorModel(SimBehaviour(legacy_turn_blanks=4))
    for f in frames(render_speech("are you there")):
        m.step(PositionInput(f))
    controls = [m.step(PositionInput(SILENT_INPUT_FRAME)).agent.control for _ in range(4)]
    assert controls == [AgentControl.PAD] * 3 + [AgentControl.AGENT_BOS]


def test_slow_positions_use_the_injected_sleep_and_failures_raise_model_errors():
    slept = []
    m = SimulatorModel(SimBehaviour(step_delay_s=0.25, prefill_delay_s=1.0, fail_at_position=2), sleep=slept.append)
    m.prefill(SessionPrompt())
    m.step(PositionInput(SILENT_INPUT_FRAME))
    m.step(PositionInput(SILENT_INPUT_FRAME))
    with pytest.raises(ModelError):
        m.step(PositionInput(SILENT_INPUT_FRAME))
    assert slept == [1.0, 0.25, 0.25]
    with pytest.raises(ModelError):
        SimulatorModel().step(PositionInput(b"\x00\x00"))


def test_real_speech_is_a_placeholder_and_is_deterministic():
    import numpy as np

    rng = np.random.default_rng(0)
    noise = (rng.standard_normal(16_000 * 12 // 10) * 3000).astype("<i2").tobytes()
    outs = []
    for _ in range(2):
        m = SimulatorModel()
        heard = say(m, "", silence=0)
        for f in frames(noise) + [SILENT_INPUT_FRAME] * 3:
            heard += m.step(PositionInput(f)).rnnt.text_delta
        outs.append(heard)
    assert outs[0] == outs[1] == "[speech 1.2 s]"


def test_reply_keeps_the_transcripts_own_final_punctuation():
    m = SimulatorModel()
    say(m, "is it raining?")
    m.step(PositionInput(SILENT_INPUT_FRAME, PositionControls(eou_now=True)))
    assert "".join(r.agent.delta for r in until_listening(m)) == "You said: is it raining?"


def test_prefill_resets_and_abort_is_idempotent():
    m = SimulatorModel()
    say(m, "x")
    m.abort()
    m.abort()
    assert m.aborted and m.positions == 0
    m.prefill(SessionPrompt("p", TOOLS))
    assert not m.aborted and m.prompt.tools == TOOLS and json.dumps(m.prefills) == "1"
