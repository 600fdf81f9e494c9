"""Configuration (model-ready barrier, settings lock), session.stop, disconnect and model failures."""

from __future__ import annotations

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.model.port import SessionPrompt
from vllm_omni_voicechat.session.commands import AppendAudio, CommitTurn, Configure, RequestTypedInput, StartTurn, Stop
from vllm_omni_voicechat.session.events import AbortModel, Error, Prefill, SessionClosed, SessionConfigured
from vllm_omni_voicechat.sim.model import SimBehaviour

from .helpers import LOUD_NOISE_FRAME, SILENCE_FRAME, R, T, metrics, names, protocol, session


def test_configure_prefills_before_the_ack_and_identical_updates_reack_without_restart():
    d = session(configure=False)
    out = d.core.receive(Configure(SessionPrompt("a"), "u1"), 0.0)
    assert out == [Prefill(SessionPrompt("a"))]  # no ack before the prefill completed
    assert d.core.poll(0.0).position is None  # no model step during configuration
    assert d.core.prefilled(0.1) == [SessionConfigured(SessionPrompt("a"), "u1", restarted=True)]
    assert d.core.receive(Configure(SessionPrompt("a"), "u2"), 0.2) == [
        SessionConfigured(SessionPrompt("a"), "u2", restarted=False)
    ]
    assert d.core.receive(Configure(SessionPrompt("b"), "u3"), 0.3) == [Prefill(SessionPrompt("b"))]


def test_audio_before_configuration_is_rejected_and_nothing_runs():
    d = session(configure=False)
    out = d.send(AppendAudio(LOUD_NOISE_FRAME, "a1"))
    assert protocol(out) == [("Error", "session_not_configured", "send session.update before audio", False, "a1", {})]
    out = d.send(StartTurn(1, "s1"))
    assert [(e.code, e.fatal) for e in out if isinstance(e, Error)] == [("session_not_configured", False)]
    assert d.run() == []
    assert not d.core.closed


def test_settings_lock_at_turn_start_even_before_any_frame():
    d = session()
    d.send(StartTurn(1, "s1"))
    out = d.send(Configure(SessionPrompt("changed"), "u2"))
    assert [(e.code, e.fatal, e.client_event_id) for e in out] == [("settings_locked", False, "u2")]


def test_settings_lock_at_typed_job_and_after_any_position():
    d = session()
    d.send(RequestTypedInput("j", "hi"))
    assert [e.code for e in d.send(Configure(SessionPrompt("x")))] == ["settings_locked"]
    d2 = session()
    d2.send(AppendAudio(LOUD_NOISE_FRAME * 4))  # opens the gate: positions run outside any turn
    d2.run()
    assert d2.core.settings_locked
    assert [e.code for e in d2.send(Configure(SessionPrompt("x")))] == ["settings_locked"]


def test_prefill_failure_is_fatal_internal_error_with_session_closed():
    class BadModel:
        def prefill(self, prompt):
            raise RuntimeError("out of memory")

        def step(self, position):
            raise AssertionError

        def abort(self):
            pass

    from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
    from vllm_omni_voicechat.shell.sync import SyncDriver

    d = SyncDriver(SessionCore(SessionConfig(session_id="S")), BadModel())
    d.send(Configure(SessionPrompt()))
    assert protocol(d.events) == [
        ("Error", "internal_error", "model prefill failed: out of memory", True, None, {}),
        ("SessionClosed", "failed", "internal_error"),
    ]


def test_stop_closes_open_turn_and_response_with_client_stop():
    d = session(settlement_blank_frames=2)
    d.send(StartTurn(1, "s1"))
    d.send(AppendAudio(render_speech("One two three four")))
    d.send(CommitTurn(1, "c1"))
    d.run(advance_time=False)
    d.send(StartTurn(2, "s2"))
    d.send(AppendAudio(LOUD_NOISE_FRAME + SILENCE_FRAME[:100]))
    d.run(advance_time=False)
    d.events.clear()
    d.send(Stop("stop-1"))
    d.run(advance_time=False)
    assert [m.kind for m in metrics(d.events)] == ["final"]  # flushes the partial frame
    assert protocol(d.events)[-3:] == [
        ("SpeechStopped", T(2), "microphone", None),
        ("TranscriptCompleted", T(2), "", "microphone", None),
        ("SessionClosed", "completed", "client_stop"),
    ]
    assert d.core.closed


def test_stop_with_an_open_response_completes_it_with_client_stop():
    d = session(settlement_blank_frames=2)
    d.send(StartTurn(1, "s1"))
    d.send(CommitTurn(1, "c1"))
    d.run(advance_time=False)
    d.events.clear()
    d.send(Stop())
    d.run(advance_time=False)
    assert protocol(d.events) == [
        ("TextDone", T(1), R(1), ""),
        ("AudioDone", T(1), R(1), False),
        ("ResponseDone", T(1), R(1), "completed", "client_stop"),
        ("SessionClosed", "completed", "client_stop"),
    ]


def test_stop_before_any_audio_aborts_the_unused_model_session():
    d = session()
    d.events.clear()
    d.send(Stop())
    d.run()
    assert protocol(d.events) == [("SessionClosed", "completed", "client_stop")]
    assert isinstance(d.effects[-1], AbortModel)
    assert "ResponseCreated" not in names(d.events)


def test_disconnect_tears_down_silently():
    d = session(settlement_blank_frames=2)
    d.send(StartTurn(1, "s1"))
    d.run()
    out = d.core.disconnect(1.0)
    assert out == [AbortModel()]
    assert d.core.closed and d.core.poll(2.0).outputs == []
    assert d.core.receive(Stop(), 3.0) == []


def test_model_failure_is_fatal_internal_error_with_session_closed_after_abort():
    d = session(behaviour=SimBehaviour(fail_at_position=1))
    d.send(AppendAudio(LOUD_NOISE_FRAME * 4))
    d.run()
    assert protocol(d.events)[-2:] == [
        ("Error", "internal_error", "model failure: simulated model failure at position 1", True, None, {}),
        ("SessionClosed", "failed", "internal_error"),
    ]
    assert isinstance(d.effects[-1], AbortModel)
    assert d.events[-1] == SessionClosed("failed", "internal_error")


def test_response_keeps_moving_on_the_80ms_grid_when_the_client_stops_streaming():
    d = session(settlement_blank_frames=2)
    d.send(StartTurn(1, "s1"))
    d.send(AppendAudio(render_speech("Hello")))
    d.send(CommitTurn(1, "c1"))
    d.run(advance_time=False)
    t0 = d.clock.now
    d.run()  # the virtual clock advances to each silence deadline
    silent = metrics(d.events, "response_silence")
    assert len(silent) >= 5 and names(d.events)[-1] == "ResponseDone"
    assert d.clock.now - t0 >= 0.08 * (len(silent) - 1)
    assert d.core.idle
    assert d.core.poll(d.clock.now + 10).position is None  # listening with no audio: nothing runs
