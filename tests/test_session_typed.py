"""Typed input jobs: accept/reject order, injection brackets, replacement, gating, failures."""

from __future__ import annotations

import pytest

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.session.commands import AppendAudio, CommitTurn, RequestTypedInput, StartTurn, Stop
from vllm_omni_voicechat.session.events import Error, TypedRejected
from vllm_omni_voicechat.sim.model import SimBehaviour

from .helpers import LOUD_NOISE_FRAME, R, T, metrics, names, protocol, session


def test_typed_turn_exact_sequence():
    d = session(settlement_blank_frames=3)
    d.events.clear()
    d.send(RequestTypedInput("j1", "Hi there"))
    d.run()
    p = protocol(d.events)
    assert p[:9] == [
        ("TypedAccepted", "j1"),
        ("TypedInjectionStarted", "j1"),
        ("SpeechStarted", T(1), "typed", "j1", "j1"),
        ("TranscriptDelta", T(1), "Hi", "Hi", "typed", "j1"),
        ("TranscriptDelta", T(1), " there", "Hi there", "typed", "j1"),
        ("SpeechStopped", T(1), "typed", "j1"),
        ("TranscriptCompleted", T(1), "Hi there", "typed", "j1"),
        ("ResponseCreated", T(1), R(1)),
        ("TypedInjectionFinished", "j1", "completed"),
    ]
    assert p[-1] == ("ResponseDone", T(1), R(1), "completed", "post_eos_audio_silence")
    assert "TurnStarted" not in names(d.events) and "TurnCommitted" not in names(d.events)
    # speech_started precedes the job's first metrics; typed audio then settlement, unpaced.
    first_metrics = next(i for i, e in enumerate(d.events) if type(e).__name__ == "PositionMetrics")
    assert names(d.events[:first_metrics])[:3] == ["TypedAccepted", "TypedInjectionStarted", "SpeechStarted"]
    kinds = [m.kind for m in metrics(d.events)]
    assert kinds[0] == "typed" and "settlement" in kinds


@pytest.mark.parametrize(
    ("setup", "job_id", "text", "reason"),
    [
        ({"configure": False}, "j", "hello", "session_not_configured"),
        ({"typed_input_ready": False}, "j", "hello", "typed_input_unavailable"),
        ({"mic_turn": True}, "j", "hello", "input_turn_active"),
        ({}, "", "hello", "invalid_job_id"),
        ({}, "x" * 129, "hello", "invalid_job_id"),
        ({}, 7, "hello", "invalid_job_id"),
        ({}, "used", "hello", "duplicate_job_id"),
        ({}, "j", "", "empty_text"),
        ({}, "j", "   \n", "empty_text"),
        ({}, "j", None, "empty_text"),
        ({}, "j", "a" * 1001, "text_too_long"),
        # order: the earlier check wins when several apply
        ({"typed_input_ready": False, "mic_turn": True}, "", "", "typed_input_unavailable"),
        ({"mic_turn": True}, "", "", "input_turn_active"),
        ({}, "", "", "invalid_job_id"),
        ({}, "used", "", "duplicate_job_id"),
    ],
)
def test_every_rejection_reason_in_contract_order(setup, job_id, text, reason):
    setup = dict(setup)
    mic_turn = setup.pop("mic_turn", False)
    d = session(settlement_blank_frames=2, **setup)
    if job_id == "used":
        d.send(RequestTypedInput("used", "first"))
        d.run()
    if mic_turn:
        d.send(StartTurn(1, "s1"))
        d.run(advance_time=False)
    d.events.clear()
    out = d.send(RequestTypedInput(job_id, text))
    assert protocol(out) == [("TypedRejected", job_id, reason)]
    assert not d.core.closed  # rejections are recoverable


def test_text_of_exactly_1000_chars_and_job_id_of_128_are_accepted():
    d = session()
    out = d.send(RequestTypedInput("x" * 128, "a" * 1000))
    assert protocol(out)[0] == ("TypedAccepted", "x" * 128)


def test_duplicate_job_id_after_any_outcome():
    d = session(typed_input_ready=True, synthesizer=_FailingSynth())
    d.send(RequestTypedInput("j1", "hello"))  # fails in synthesis: disposition error
    assert protocol(d.send(RequestTypedInput("j1", "again"))) == [("TypedRejected", "j1", "duplicate_job_id")]


def test_replacement_before_mutation_is_cancel_close_start():
    d = session(settlement_blank_frames=2)
    d.events.clear()
    d.send(RequestTypedInput("old", "first"))
    d.send(RequestTypedInput("new", "second"))
    d.run()
    p = protocol(d.events)
    assert p[:4] == [
        ("TypedAccepted", "old"),
        ("TypedInjectionFinished", "old", "replaced"),
        ("TypedAccepted", "new"),
        ("TypedInjectionStarted", "new"),
    ]
    assert ("TypedInjectionStarted", "old") not in p
    assert names(d.events).count("ResponseCreated") == 1


def test_an_id_waiting_behind_the_active_job_is_taken():
    d = session(settlement_blank_frames=2)
    d.send(RequestTypedInput("a", "one two three"))
    tick = d.core.poll(d.clock.now)  # "a" has mutated the model: "b" waits behind it
    d.dispatch(tick.outputs)
    d.send(RequestTypedInput("b", "four"))
    d.events.clear()
    for job_id in ("a", "b"):
        assert protocol(d.send(RequestTypedInput(job_id, "again"))) == [("TypedRejected", job_id, "duplicate_job_id")]


def test_request_while_a_job_is_injecting_waits_for_it_to_finish():
    d = session(settlement_blank_frames=2)
    d.send(RequestTypedInput("a", "one two three"))
    tick = d.core.poll(d.clock.now)  # the first typed position is in flight: the job has mutated the model
    d.dispatch(tick.outputs)
    assert tick.position is not None
    d.events.clear()
    d.send(RequestTypedInput("b", "four"))
    assert names(d.events) == []  # held until "a" finishes
    d.dispatch(d.core.complete(tick.position, d.model.step(tick.position.input), d.clock.now))
    d.run()
    p = protocol(d.events)
    fin_a = p.index(("TypedInjectionFinished", "a", "completed"))
    assert p[fin_a + 1] == ("TypedAccepted", "b")
    assert ("TypedInjectionFinished", "b", "completed") in p


def test_at_most_eight_requests_wait_behind_a_job_that_mutated_the_model_and_the_ninth_is_refused():
    """The limit on typed requests in flight (``MAX_QUEUED_TYPED_REQUESTS``): one job active, eight waiting; the
    next is answered at once with ``typed_input_unavailable`` and the waiting ones still run, in order."""
    from vllm_omni_voicechat.session.typed import MAX_QUEUED_TYPED_REQUESTS

    assert MAX_QUEUED_TYPED_REQUESTS == 8
    d = session(settlement_blank_frames=2)
    d.send(RequestTypedInput("a", "one"))
    tick = d.core.poll(d.clock.now)  # "a" has mutated the model: later requests wait behind it
    d.dispatch(tick.outputs)
    d.events.clear()
    for k in range(MAX_QUEUED_TYPED_REQUESTS):
        assert d.send(RequestTypedInput(f"w{k}", "hi")) == []
    assert protocol(d.send(RequestTypedInput("over", "hi"))) == [("TypedRejected", "over", "typed_input_unavailable")]
    d.dispatch(d.core.complete(tick.position, d.model.step(tick.position.input), d.clock.now))
    d.run()
    finished = [p[1] for p in protocol(d.events) if p[0] == "TypedInjectionFinished"]
    assert finished == ["a", *(f"w{k}" for k in range(MAX_QUEUED_TYPED_REQUESTS))]


def test_typed_request_cancels_the_open_response_with_reason_typed_input():
    d = session(settlement_blank_frames=2)
    d.send(StartTurn(1, "s1"))
    d.send(AppendAudio(render_speech("Talk to me for a while")))
    d.send(CommitTurn(1, "c1"))
    d.run(advance_time=False)
    assert d.core.response is not None
    d.events.clear()
    d.send(RequestTypedInput("j", "Stop"))
    d.run(advance_time=False)
    p = protocol(d.events)
    assert p[:6] == [
        ("TypedAccepted", "j"),
        ("TextDone", T(1), R(1), ""),
        ("AudioDone", T(1), R(1), False),
        ("ResponseDone", T(1), R(1), "cancelled", "typed_input"),
        ("TypedInjectionStarted", "j"),
        ("SpeechStarted", T(2), "typed", "j", "j"),
    ]


def test_microphone_audio_is_dropped_while_a_job_runs():
    d = session(settlement_blank_frames=2)
    d.send(RequestTypedInput("j", "Hello"))
    d.send(AppendAudio(LOUD_NOISE_FRAME * 3))
    d.run()
    assert metrics(d.events, "real") == []
    assert [m for m in metrics(d.events) if m.frame is None] == []


def test_injection_finished_is_a_readiness_barrier_for_the_next_turn():
    d = session(settlement_blank_frames=2)
    d.send(RequestTypedInput("j", "Hello"))
    d.run(advance_time=False)  # up to the EOU/BOS position: finished is out, the response is still open
    assert names(d.events)[-1] == "TypedInjectionFinished"
    assert d.core.response is not None
    d.events.clear()
    d.send(StartTurn(1, "s1"))  # accepted at once: the typed owner was cleared before finished was sent
    d.run(advance_time=False)
    assert not d.core.closed
    assert protocol(d.events)[-2:] == [
        ("SpeechStarted", T(2), "microphone", None, 1),
        ("TurnStarted", T(2), 1, "s1"),
    ]


class _FailingSynth:
    name = "failing"
    ready = True

    def synthesize(self, text: str) -> bytes:
        raise RuntimeError("voice unavailable")


def test_synthesis_failure_before_mutation_is_recoverable():
    d = session(synthesizer=_FailingSynth(), settlement_blank_frames=2)
    d.events.clear()
    d.send(RequestTypedInput("j", "Hello"))
    p = protocol(d.events)
    assert p[0] == ("TypedAccepted", "j")
    assert p[1][:5] == ("Error", "typed_input_failed", "typed input synthesis failed: voice unavailable", False, "j")
    assert p[2] == ("TypedInjectionFinished", "j", "error")
    assert not d.core.closed
    d.send(StartTurn(1, "s1"))  # the session is still usable
    d.send(CommitTurn(1, "c1"))
    d.run()
    assert "ResponseDone" in names(d.events)


def test_model_failure_after_mutation_is_fatal_without_injection_finished():
    d = session(behaviour=SimBehaviour(fail_at_position=1), settlement_blank_frames=2)
    d.events.clear()
    d.send(RequestTypedInput("j", "Hello there friend"))
    d.run()
    errors = [e for e in d.events if isinstance(e, Error)]
    assert [(e.code, e.fatal) for e in errors] == [("typed_input_failed", True)]
    assert "TypedInjectionFinished" not in names(d.events)
    assert d.core.closed


def test_stop_cancels_a_job_that_has_not_started():
    d = session(settlement_blank_frames=2)
    d.send(RequestTypedInput("j", "Hello"))
    d.events.clear()
    d.send(Stop())
    d.run()
    assert protocol(d.events) == [
        ("TypedInjectionFinished", "j", "cancelled"),
        ("SessionClosed", "completed", "client_stop"),
    ]


def test_typed_rejection_echoes_non_string_job_ids():
    d = session()
    out = d.send(RequestTypedInput(None, "x"))
    assert out == [TypedRejected(None, "invalid_job_id")]
