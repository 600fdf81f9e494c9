"""The position envelope and Stage-2 audio alignment of the vLLM-Omni adapter (pure parts; no vllm needed)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.audio.frames import (
    INPUT_FRAME_BYTES,
    OUTPUT_FRAME_SAMPLES,
    SILENT_OUTPUT_FRAME,
)
from vllm_omni_voicechat.model.port import PositionControls
from vllm_omni_voicechat.omni.alignment import AudioAligner, BoundaryRetimer
from vllm_omni_voicechat.omni.envelope import (
    EnvelopeError,
    check_envelope,
    encode_controls,
    f32_to_pcm16,
    frame_to_f32,
)


def ids(tokens):
    return [100 + len(t) for t in tokens]


def test_controls_encode_every_field_but_reset():
    c = PositionControls(eou_at_fence=10, agent_eos=True, pre_eou=True, tool_result_tokens=("<", "ok"), reset=True)
    assert encode_controls(c, position=7, synthetic=True, token_ids=ids) == {
        "v": 1, "position": 7, "synthetic": True, "eou_now": False, "eou_at_fence": 10, "cancel_eou": False,
        "agent_eos": True, "force_text_pad": False, "pre_eou": True, "tool_result_token_ids": [101, 102],
        "tool_result_tokens": ["<", "ok"],
    }


def test_controls_round_trip_through_the_envelope_except_reset():
    from vllm_omni_voicechat.omni.envelope import decode_controls

    c = PositionControls(eou_now=True, eou_at_fence=3, cancel_eou=True, agent_eos=True, force_text_pad=True,
                         tool_result_tokens=("a",), pre_eou=True, reset=True)
    vc = encode_controls(c, position=0, synthetic=False, token_ids=ids)
    assert decode_controls(vc) == dataclasses.replace(c, reset=False)


def test_step_evidence_round_trips_without_audio():
    from vllm_omni_voicechat.model.port import PositionInput, SessionPrompt
    from vllm_omni_voicechat.omni.envelope import decode_step, encode_evidence
    from vllm_omni_voicechat.sim.model import SimulatorModel
    from vllm_omni_voicechat.audio.speech import render_speech

    sim = SimulatorModel()
    sim.prefill(SessionPrompt("Be brief."))
    frames = render_speech("hi") + bytes(2560 * 12)
    results = [sim.step(PositionInput(frames[i:i + 2560].ljust(2560, b"\0"), PositionControls(eou_now=i == 14)))
               for i in range(0, 2560 * 20, 2560)]
    for r in results:
        back = decode_step(json.loads(json.dumps(encode_evidence(r))), r.audio, r.timings.inference_ms)
        assert back == r


def test_an_envelope_for_another_position_is_refused():
    vc = encode_controls(PositionControls(), position=3, synthetic=False, token_ids=ids)
    assert check_envelope(vc, 3) is vc
    with pytest.raises(EnvelopeError, match="expected 4"):
        check_envelope(vc, 4)
    with pytest.raises(EnvelopeError, match="not a v1"):
        check_envelope({"position": 3}, 3)


def test_frames_convert_to_f32_and_back_exactly():
    pcm = np.arange(-640, 640, dtype="<i2").tobytes()
    f = frame_to_f32(pcm)
    assert f.dtype == np.float32 and f.shape == (1280,) and f.min() >= -1 and f.max() < 1
    assert f32_to_pcm16(f * 32768 / 32767) == pcm
    with pytest.raises(EnvelopeError):
        frame_to_f32(bytes(INPUT_FRAME_BYTES - 2))


def test_f32_to_pcm16_clips_and_cleans():
    assert np.frombuffer(f32_to_pcm16(np.array([2.0, -2.0, np.nan, np.inf])), "<i2").tolist() == [32767, -32767, 0, 32767]


@settings(max_examples=60, deadline=None)
@given(lag=st.integers(0, 3), sizes=st.lists(st.integers(0, 3 * OUTPUT_FRAME_SAMPLES), max_size=12))
def test_every_packet_comes_out_once_in_order_after_the_primed_lag(lag, sizes):
    rng = np.random.default_rng(0)
    stream = rng.uniform(-0.5, 0.5, sum(sizes)).astype(np.float32)
    a = AudioAligner(lag)
    cut = 0
    for n in sizes:
        a.feed(stream[cut : cut + n])
        cut += n
    packets = []
    while (p := a.take()) is not None:
        packets.append(p)
    whole = len(stream) // OUTPUT_FRAME_SAMPLES
    assert packets[:lag] == [SILENT_OUTPUT_FRAME] * lag
    assert packets[lag:] == [f32_to_pcm16(stream[i * OUTPUT_FRAME_SAMPLES : (i + 1) * OUTPUT_FRAME_SAMPLES])
                             for i in range(whole)]
    assert a.partial_samples == len(stream) - whole * OUTPUT_FRAME_SAMPLES


def test_start_forgets_and_reprimes():
    a = AudioAligner(1)
    a.feed(np.ones(OUTPUT_FRAME_SAMPLES + 5, dtype=np.float32) * 0.1)
    assert a.ready == 2
    a.start()
    assert (a.ready, a.partial_samples, a.take()) == (1, 0, SILENT_OUTPUT_FRAME)
    assert a.take() is None


def _boundary(phase: str, ended: bool = False, reason: str | None = None, started: bool = False):
    from vllm_omni_voicechat.model.port import BoundaryPhase, ResponseBoundary

    return ResponseBoundary(BoundaryPhase(phase), started, ended, reason)


@st.composite
def _timelines(draw):
    """Stage-0 boundaries of several responses: each BOS (started) at least ``gap`` positions after the previous
    end, as a settlement guarantees."""
    lag = draw(st.integers(0, 3))
    out = [_boundary("idle") for _ in range(draw(st.integers(0, 3)))]
    for k in range(draw(st.integers(0, 3))):
        out.append(_boundary("responding", started=True))
        out += [_boundary("responding") for _ in range(draw(st.integers(0, 4)))]
        out.append(_boundary("complete", ended=True, reason=f"eos{k}"))
        out += [_boundary("idle") for _ in range(lag + draw(st.integers(0, 3)))]
    return lag, out


@settings(max_examples=100, deadline=None)
@given(_timelines())
def test_a_response_end_moves_lag_positions_later_onto_its_last_packet(timeline):
    lag, boundaries = timeline
    retimer = BoundaryRetimer(lag)
    out = [retimer.retime(b) for b in boundaries]
    ends = [(i, b.reason) for i, b in enumerate(boundaries) if b.ended]
    assert [(i, b.reason) for i, b in enumerate(out) if b.ended] == [(i + lag, r) for i, r in ends]
    assert [b.started for b in out] == [b.started for b in boundaries]  # BOS stays on the text timeline
    held = {i + k for i, _ in ends for k in range(lag)}
    for i, (before, after) in enumerate(zip(boundaries, out)):
        if i in held:
            assert (after.phase.value, after.ended, after.reason) == ("tail_draining", False, None)
        elif not after.ended:
            assert after == before


def test_a_new_request_drops_a_held_end():
    retimer = BoundaryRetimer(2)
    assert retimer.retime(_boundary("complete", ended=True, reason="eos")).ended is False
    assert retimer.holding
    retimer.start()
    assert not retimer.holding
    assert retimer.retime(_boundary("idle")) == _boundary("idle")
    with pytest.raises(ValueError):
        BoundaryRetimer(-1)


def _sim_results():
    from vllm_omni_voicechat.model.port import PositionInput, SessionPrompt
    from vllm_omni_voicechat.sim.model import SimulatorModel
    from vllm_omni_voicechat.audio.speech import render_speech

    sim = SimulatorModel()
    sim.prefill(SessionPrompt("Be brief."))
    frames = render_speech("hi") + bytes(2560 * 12)
    return [sim.step(PositionInput(frames[i:i + 2560].ljust(2560, b"\0"), PositionControls(eou_now=i == 2560 * 14)))
            for i in range(0, 2560 * 20, 2560)]


def test_evidence_survives_the_engine_wire_in_every_form_it_can_arrive_in():
    # vLLM-Omni's worker keeps only tensors in a step's multimodal output: the thinker sends JSON bytes as uint8.
    from vllm_omni_voicechat.omni.envelope import (
        decode_step,
        encode_evidence,
        evidence_to_wire,
    )

    results = _sim_results()
    for r in results:
        wire = evidence_to_wire(encode_evidence(r))
        as_u8 = np.frombuffer(wire, np.uint8)
        forms = (encode_evidence(r), wire, bytearray(wire), as_u8, as_u8.astype(np.int64), list(wire), [as_u8],
                 np.concatenate([as_u8, np.zeros(3, np.uint8)]),  # trailing NULs of a padded buffer
                 evidence_to_wire(encode_evidence(results[0])) + wire)  # an accumulated segment: the last step
        for form in forms:
            assert decode_step(form, r.audio, r.timings.inference_ms) == r


@pytest.mark.parametrize("bad", [b"\xff\xfe", b"[1, 2]", b"{\"agent\": 1", np.array([1, 2], np.uint8), b"", b"{} x"])
def test_malformed_evidence_bytes_are_an_envelope_error(bad):
    from vllm_omni_voicechat.omni.envelope import decode_step

    with pytest.raises(EnvelopeError):
        decode_step(bad, SILENT_OUTPUT_FRAME, 0.0)
