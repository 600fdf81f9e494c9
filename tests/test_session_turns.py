"""Client-owned microphone turns through the session core and runner, on the simulator, exact event sequences."""

from __future__ import annotations

import pytest

from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.model.port import SessionPrompt, ToolSpec
from vllm_omni_voicechat.session.commands import AppendAudio, CommitTurn, Configure, StartTurn
from vllm_omni_voicechat.ops.tally import SessionTally
from vllm_omni_voicechat.session.events import Error, PositionMetrics, SessionClosed
from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.shell.sync import SyncDriver
from vllm_omni_voicechat.sim.model import SimBehaviour
from vllm_omni_voicechat.synth.simulated import SimulatorSynthesizer

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.session.events import AudioDelta

from .helpers import (
    LOUD_NOISE_FRAME,
    SID,
    SILENCE_FRAME,
    BatchedModel,
    R,
    T,
    audio,
    metrics,
    names,
    protocol,
    session,
)

TOOLS = (ToolSpec("get_weather", "Weather for a city", {"type": "object", "properties": {"city": {"type": "string"}}}),)


def spoken_turn(d, k: int, text: str, *, start_id: str | None = None, commit_id: str | None = None) -> None:
    d.send(StartTurn(k, start_id or f"s{k}"))
    d.send(AppendAudio(render_speech(text)))
    d.send(CommitTurn(k, commit_id or f"c{k}"))


def test_happy_turn_exact_sequence():
    d = session(settlement_blank_frames=3)
    d.events.clear()
    spoken_turn(d, 1, "Hello world")
    d.run()
    assert protocol(d.events) == [
        ("SpeechStarted", T(1), "microphone", None, 1),
        ("TurnStarted", T(1), 1, "s1"),
        ("TranscriptDelta", T(1), "Hello", "Hello", "microphone", None),
        ("TranscriptDelta", T(1), " world", "Hello world", "microphone", None),
        ("TurnCommitted", T(1), 1, "c1"),
        ("SpeechStopped", T(1), "microphone", None),
        ("TranscriptCompleted", T(1), "Hello world", "microphone", None),
        ("ResponseCreated", T(1), R(1)),
        ("TextDelta", T(1), R(1), "You", "You"),
        ("TextDelta", T(1), R(1), " sai", "You sai"),
        ("TextDelta", T(1), R(1), "d:", "You said:"),
        ("TextDelta", T(1), R(1), " Hel", "You said: Hel"),
        ("TextDelta", T(1), R(1), "lo", "You said: Hello"),
        ("TextDelta", T(1), R(1), " wor", "You said: Hello wor"),
        ("TextDelta", T(1), R(1), "ld.", "You said: Hello world."),
        ("TextDone", T(1), R(1), "You said: Hello world."),
        ("AudioDone", T(1), R(1), False),
        ("ResponseDone", T(1), R(1), "completed", "post_eos_audio_silence"),
    ]
    # The assistant's audio says what its text says.
    assert decode_speech(audio(d.events), 22_050) == "You said: Hello world."
    # Every position has exactly one metrics event, numbered 0, 1, 2, ... with the budget.
    frames = [m.frame for m in metrics(d.events)]
    assert frames == list(range(len(frames)))
    assert all(m.budget_ms == 80 for m in metrics(d.events))


def test_committed_is_published_ahead_of_the_fused_fence_position():
    d = session(settlement_blank_frames=3)
    spoken_turn(d, 1, "Hi")
    d.run()
    seq = [(type(e).__name__, getattr(e, "kind", None)) for e in d.events]
    i = seq.index(("TurnCommitted", None))
    # committed, speech stopped, completed, response.created, BOS audio, then that position's metrics
    assert [s[0] for s in seq[i : i + 6]] == [
        "TurnCommitted",
        "SpeechStopped",
        "TranscriptCompleted",
        "ResponseCreated",
        "AudioDelta",
        "PositionMetrics",
    ]
    assert seq[i + 5][1] == "settlement"


def test_empty_transcript_commit_still_gets_one_response():
    d = session(settlement_blank_frames=3)
    d.events.clear()
    d.send(StartTurn(1, "s1"))
    d.send(CommitTurn(1, "c1"))
    d.run()
    assert protocol(d.events)[:6] == [
        ("SpeechStarted", T(1), "microphone", None, 1),
        ("TurnStarted", T(1), 1, "s1"),
        ("TurnCommitted", T(1), 1, "c1"),
        ("SpeechStopped", T(1), "microphone", None),
        ("TranscriptCompleted", T(1), "", "microphone", None),
        ("ResponseCreated", T(1), R(1)),
    ]
    assert names(d.events).count("ResponseCreated") == 1
    assert protocol(d.events)[-1] == ("ResponseDone", T(1), R(1), "completed", "post_eos_audio_silence")
    # Exactly the missing fence positions ran: 3 settlement positions, the last one fused with BOS.
    assert [m.kind for m in metrics(d.events)][:3] == ["settlement"] * 3


def test_idempotent_start_and_commit_retries_reack_with_the_retry_event_id():
    d = session(settlement_blank_frames=3)
    d.events.clear()
    d.send(StartTurn(1, "s1"))
    d.send(StartTurn(1, "s1-retry"))
    d.send(AppendAudio(render_speech("Yes")))
    d.send(CommitTurn(1, "c1"))
    d.send(CommitTurn(1, "c1-retry"))
    d.run()
    p = protocol(d.events)
    assert p[:3] == [
        ("SpeechStarted", T(1), "microphone", None, 1),
        ("TurnStarted", T(1), 1, "s1"),
        ("TurnStarted", T(1), 1, "s1-retry"),
    ]
    i = p.index(("TurnCommitted", T(1), 1, "c1"))
    assert ("TurnCommitted", T(1), 1, "c1-retry") in p[i + 1 :]
    assert names(d.events).count("ResponseCreated") == 1
    assert names(d.events).count("SpeechStarted") == 1
    # A later retry of an old start is still re-acked (remembered), with no new turn.
    d.events.clear()
    d.send(StartTurn(1, "s1-late"))
    d.run()
    assert protocol(d.events) == [("TurnStarted", T(1), 1, "s1-late")]


def test_remembered_ids_are_bounded_to_the_last_16():
    d = session(settlement_blank_frames=1)
    for k in range(1, 18):
        d.send(StartTurn(k, f"s{k}"))
        d.send(CommitTurn(k, f"c{k}"))
        d.run()
    d.events.clear()
    d.send(StartTurn(17, "again"))  # remembered: re-ack
    d.run()
    assert protocol(d.events) == [("TurnStarted", T(17), 17, "again")]
    d.send(StartTurn(1, "forgotten"))  # forgotten: a fresh turn with a new turn id
    d.run()
    assert ("TurnStarted", T(18), 1, "forgotten") in protocol(d.events)


def _fatal(d) -> Error:
    errors = [e for e in d.events if isinstance(e, Error)]
    assert errors and errors[-1].fatal
    assert d.core.closed
    return errors[-1]


def test_conflict_turn_start_while_a_turn_is_open():
    d = session()
    d.send(StartTurn(1, "s1"))
    d.send(StartTurn(2, "s2"))
    e = _fatal(d)
    assert (e.code, e.client_event_id, e.details) == (
        "input_turn_conflict",
        "s2",
        {"client_turn_id": 2, "open_client_turn_id": 1},
    )
    assert "AbortModel" in [type(x).__name__ for x in d.effects]
    assert d.send(AppendAudio(SILENCE_FRAME)) == []  # nothing after a fatal


def test_conflict_commit_of_another_turn():
    d = session()
    d.send(StartTurn(1, "s1"))
    d.send(CommitTurn(2, "c2"))
    e = _fatal(d)
    assert (e.code, e.client_event_id, e.details) == (
        "input_turn_conflict",
        "c2",
        {"client_turn_id": 2, "open_client_turn_id": 1},
    )


def test_conflict_commit_without_an_open_turn():
    d = session()
    d.send(CommitTurn(1, "c1"))
    e = _fatal(d)
    assert (e.code, e.details) == ("input_turn_conflict", {"client_turn_id": 1, "open_client_turn_id": None})
    assert "SessionClosed" not in names(d.events)


def test_conflict_turn_start_during_a_typed_job():
    from vllm_omni_voicechat.session.commands import RequestTypedInput

    d = session()
    d.send(RequestTypedInput("j1", "Hello"))
    d.send(StartTurn(1, "s1"))
    e = _fatal(d)
    assert (e.code, e.client_event_id) == ("input_turn_conflict", "s1")


def test_settlement_bound_exceeded_is_fatal_without_committed():
    d = session(behaviour=SimBehaviour(never_reach_fence=True), settlement_blank_frames=3)
    d.events.clear()
    d.send(StartTurn(1, "s1"))
    d.send(CommitTurn(1, "c1"))
    d.run()
    assert len(metrics(d.events, "settlement")) == 6  # exactly 2 x fence
    assert "TurnCommitted" not in names(d.events)
    assert "ResponseCreated" not in names(d.events)
    e = _fatal(d)
    assert e.code == "input_turn_settle_timeout"
    assert e.details["settlement"]["target_blank_frames"] == 3
    assert e.details["settlement"]["max_model_steps"] == 6
    assert (e.details["source"], e.details["job_id"]) == ("microphone", None)
    assert names(d.events)[-1] == "Error"


def test_pre_eou_response_activity_is_fatal_and_the_violating_position_is_never_published():
    # Positions: 0 real frame, then settlement 1, 2, 3; the model opens a response by itself on position 2.
    d = session(behaviour=SimBehaviour(self_start_response_at=2), settlement_blank_frames=3)
    d.send(StartTurn(1, "s1"))
    d.send(AppendAudio(LOUD_NOISE_FRAME))
    d.send(CommitTurn(1, "c1"))
    d.run()
    e = _fatal(d)
    assert e.code == "pre_eou_response_activity"
    assert [m.frame for m in metrics(d.events)] == [0, 1]
    assert "ResponseCreated" not in names(d.events)
    assert "TurnCommitted" not in names(d.events)


def test_pre_eou_function_activity_is_fatal_and_the_violating_position_is_never_published():
    d = session(behaviour=SimBehaviour(self_start_function_at=2), settlement_blank_frames=3, tools=TOOLS)
    d.send(StartTurn(1, "s1"))
    d.send(AppendAudio(LOUD_NOISE_FRAME))
    d.send(CommitTurn(1, "c1"))
    d.run()
    e = _fatal(d)
    assert e.code == "pre_eou_function_activity"
    assert e.details["settlement"]["mode"] == "separate"
    assert [m.frame for m in metrics(d.events)] == [0, 1]


def test_fused_eou_without_tools_counts_one_real_plus_fence_positions():
    d = session(settlement_blank_frames=3)
    d.events.clear()
    d.send(StartTurn(1, "s1"))
    d.send(AppendAudio(LOUD_NOISE_FRAME))
    d.send(CommitTurn(1, "c1"))
    d.run(advance_time=False)
    kinds = [m.kind for m in metrics(d.events)]
    assert kinds == ["real", "settlement", "settlement", "settlement"]  # BOS on the third settlement position
    assert names(d.events)[-1] == "ResponseCreated"


def test_separate_eou_with_tools_adds_one_eou_position_after_committed():
    d = session(settlement_blank_frames=3, tools=TOOLS)
    d.events.clear()
    d.send(StartTurn(1, "s1"))
    d.send(AppendAudio(LOUD_NOISE_FRAME))
    d.send(CommitTurn(1, "c1"))
    d.run(advance_time=False)
    kinds = [m.kind for m in metrics(d.events)]
    assert kinds == ["real", "settlement", "settlement", "settlement", "eou"]
    seq = [(type(e).__name__, getattr(e, "kind", None)) for e in d.events]
    committed = seq.index(("TurnCommitted", None))
    eou = seq.index(("PositionMetrics", "eou"))
    assert seq[committed - 1] == ("PositionMetrics", "settlement")  # after all settlement positions
    assert names(d.events)[-4:] == ["TurnCommitted", "SpeechStopped", "TranscriptCompleted", "ResponseCreated"]
    assert committed < eou


def test_new_turn_cancels_the_open_response_before_its_speech_started():
    d = session(settlement_blank_frames=3)
    spoken_turn(d, 1, "Tell me a long story please")
    d.run(advance_time=False)  # stops right after BOS: the response is open
    assert d.core.response is not None
    d.events.clear()
    d.send(StartTurn(2, "s2"))
    d.run(advance_time=False)
    assert protocol(d.events) == [
        ("TextDone", T(1), R(1), ""),
        ("AudioDone", T(1), R(1), False),
        ("ResponseDone", T(1), R(1), "cancelled", "client_vad"),
        ("SpeechStarted", T(2), "microphone", None, 2),
        ("TurnStarted", T(2), 2, "s2"),
    ]
    tail = metrics(d.events, "cancel_tail")
    assert 1 <= len(tail) <= 27
    # Output is suppressed during the cancel tail: no audio/text deltas after the cancel started.
    assert "AudioDelta" not in [type(e).__name__ for e in d.events]


def test_cancel_tail_timeout_is_fatal_after_27_positions():
    d = session(behaviour=SimBehaviour(endless_response=True), settlement_blank_frames=3)
    spoken_turn(d, 1, "Go")
    d.run(advance_time=False)
    d.events.clear()
    d.send(StartTurn(2, "s2"))
    d.run(advance_time=False)
    assert len(metrics(d.events, "cancel_tail")) == 27
    e = _fatal(d)
    assert e.code == "response_cancel_timeout"
    assert "SpeechStarted" not in names(d.events)


def test_onset_preroll_replays_the_onset_suffix_with_transport_numbers():
    d = session(settlement_blank_frames=3)
    for _ in range(10):
        d.send(AppendAudio(SILENCE_FRAME))
    for _ in range(2):
        d.send(AppendAudio(LOUD_NOISE_FRAME))
    gated = [m for m in metrics(d.events) if m.frame is None]
    assert [m.transport_frame for m in gated] == list(range(12))  # held frames: idle metrics only
    d.events.clear()
    d.send(StartTurn(1, "s1"))
    d.run(advance_time=False)
    replayed = metrics(d.events, "real")
    assert [(m.frame, m.transport_frame) for m in replayed] == [(0, 8), (1, 9), (2, 10), (3, 11)]


def test_quiet_preroll_is_replayed_whole_and_the_gate_stays_open():
    d = session(settlement_blank_frames=3, preroll_frames=4)
    for _ in range(6):
        d.send(AppendAudio(SILENCE_FRAME))
    d.send(StartTurn(1, "s1"))
    d.run(advance_time=False)
    assert [m.transport_frame for m in metrics(d.events, "real")] == [2, 3, 4, 5]
    d.events.clear()
    d.send(AppendAudio(SILENCE_FRAME))  # gate open: every frame advances the model now
    d.run(advance_time=False)
    assert [m.transport_frame for m in metrics(d.events, "real")] == [6]


def test_gate_opens_on_speech_without_a_turn_and_rnnt_text_waits_for_the_next_turn():
    d = session(settlement_blank_frames=3)
    d.send(AppendAudio(render_speech("early words") + SILENCE_FRAME * 2))
    d.run(advance_time=False)
    assert "TranscriptDelta" not in names(d.events)  # RNNT never opens a turn
    d.events.clear()
    d.send(StartTurn(1, "s1"))
    d.send(CommitTurn(1, "c1"))
    d.run()
    p = protocol(d.events)
    assert p[2] == ("TranscriptDelta", T(1), "early words", "early words", "microphone", None)
    assert ("TranscriptCompleted", T(1), "early words", "microphone", None) in p


def test_position_guard_on_real_positions():
    d = session(max_session_model_frames=5)
    d.send(StartTurn(1, "s1"))
    for _ in range(8):
        d.send(AppendAudio(LOUD_NOISE_FRAME))
    d.run()
    assert [m.frame for m in metrics(d.events) if m.frame is not None] == [0, 1, 2, 3, 4]
    e = _fatal(d)
    assert (e.code, e.details) == ("session_position_limit", {"model_frames": 5, "max_model_frames": 5})
    assert protocol(d.events)[-3:] == [
        ("SpeechStopped", T(1), "microphone", None),
        ("TranscriptCompleted", T(1), "", "microphone", None),  # the noise is still mid-utterance
        ("SessionClosed", "failed", "session_position_limit"),
    ]


def test_position_guard_on_synthetic_settlement_positions_sends_no_committed():
    d = session(max_session_model_frames=3, settlement_blank_frames=3)
    d.send(StartTurn(1, "s1"))
    d.send(AppendAudio(LOUD_NOISE_FRAME))
    d.send(CommitTurn(1, "c1"))
    d.run()
    assert [m.kind for m in metrics(d.events)] == ["real", "settlement", "settlement"]
    assert "TurnCommitted" not in names(d.events)
    assert d.events[-1] == SessionClosed("failed", "session_position_limit")
    assert any(isinstance(e, Error) and e.code == "session_position_limit" for e in d.events)


def test_position_guard_on_response_silence_closes_the_open_response():
    d = session(max_session_model_frames=6, settlement_blank_frames=3)
    spoken_turn(d, 1, "Hi")
    d.run()
    assert protocol(d.events)[-6:] == [
        ("TextDelta", T(1), R(1), " sai", "You sai"),
        ("Error", "session_position_limit", "session reached 6 model positions", True, None,
         {"model_frames": 6, "max_model_frames": 6}),
        ("TextDone", T(1), R(1), "You sai"),
        ("AudioDone", T(1), R(1), False),
        ("ResponseDone", T(1), R(1), "failed", "session_position_limit"),
        ("SessionClosed", "failed", "session_position_limit"),
    ]
    assert max(m.frame for m in metrics(d.events) if m.frame is not None) == 5


def test_metrics_mark_input_and_kinds():
    d = session(settlement_blank_frames=2)
    spoken_turn(d, 1, "Ok")
    d.run()
    for m in metrics(d.events):
        assert isinstance(m, PositionMetrics)
        assert m.input_audio == (m.kind in ("real", "commit_tail_padding", "typed", "final"))


def test_fatal_conflict_fails_the_open_response_before_the_error():
    d = session(settlement_blank_frames=2)
    spoken_turn(d, 1, "Hi")
    d.run(advance_time=False)
    d.events.clear()
    d.send(CommitTurn(7, "bad"))
    assert protocol(d.events) == [
        ("TextDone", T(1), R(1), ""),
        ("AudioDone", T(1), R(1), False),
        ("ResponseDone", T(1), R(1), "failed", "input_turn_conflict"),
        ("Error", "input_turn_conflict", "commit 7 without an open client turn", True, "bad",
         {"client_turn_id": 7, "open_client_turn_id": None}),
    ]
    assert [type(x).__name__ for x in d.effects][-1] == "AbortModel"


def test_audio_beyond_the_queued_input_bound_is_refused_whole_and_the_session_stays_usable():
    """A client sending faster than real time: frames waiting for the model clock are bounded."""
    d = session(settlement_blank_frames=2, max_queued_input_frames=10)
    d.send(StartTurn(1, "s1"))
    speech = render_speech("hello") + SILENCE_FRAME * 14
    speech = speech[:14 * 2560]
    assert [e for e in d.send(AppendAudio(speech[:6 * 2560], "a1")) if isinstance(e, Error)] == []  # 6 queued
    refused = [e for e in d.send(AppendAudio(speech[6 * 2560:], "a2")) if isinstance(e, Error)]
    assert refused == [Error("input_backpressure", refused[0].message, False, "a2", {"max_queued_input_frames": 10})]
    assert [e for e in d.send(AppendAudio(bytes(4 * 2560), "a3")) if isinstance(e, Error)] == []  # 10: at the bound
    d.run()  # the model clock drains the queue
    assert [e for e in d.send(AppendAudio(speech[6 * 2560:], "a4")) if isinstance(e, Error)] == []
    d.send(CommitTurn(1, "c1"))
    events = d.run()
    assert not any(isinstance(e, (SessionClosed, Error)) for e in events)
    assert names(events)[-1] == "ResponseDone"


def late_ms(events, kind: str) -> list[float]:
    return [m.turn_state["late_ms"] for m in metrics(events, kind)]


def test_a_microphone_frame_waiting_behind_other_positions_is_late_by_its_wait():
    """A position is late by how long its frame could have run but did not (step queueing): the burst's frames
    queue behind one another, 10 ms a step here."""
    d = session(settlement_blank_frames=3)
    d.send(StartTurn(1, "s1"))
    d.run(advance_time=False)
    d.clock.advance(5.0)
    d.send(AppendAudio(LOUD_NOISE_FRAME * 6))
    events = d.run(advance_time=False)
    assert late_ms(events, "real") == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
    tally = SessionTally("v3", 0.0)
    tally.observe_all(events, d.clock.now)
    assert tally.late == 2  # 40 ms and more: the server's late positions


def test_a_frame_the_host_read_before_it_could_hand_it_over_is_late_from_when_it_was_read():
    """An engine-backed host hands a client frame to the session only after the position in flight: the frame was
    ready when the host read it (``arrived``), not when it was handed over."""
    d = session(settlement_blank_frames=3)
    d.send(StartTurn(1, "s1"))
    d.run(advance_time=False)
    d.clock.advance(5.0)
    d.dispatch(d.session.receive(AppendAudio(LOUD_NOISE_FRAME * 2), d.clock.now, arrived=d.clock.now - 0.06))
    d.dispatch(d.session.receive(AppendAudio(LOUD_NOISE_FRAME, arrived=d.clock.now - 0.03), d.clock.now))
    assert late_ms(d.run(advance_time=False), "real") == [60.0, 70.0, 50.0]  # 10 ms a step here


def test_the_preroll_is_late_only_from_its_release_and_the_commit_padding_from_the_commit():
    d = session(settlement_blank_frames=3)
    d.send(AppendAudio(SILENCE_FRAME * 3))  # held by the closed gate: no position
    assert metrics(d.run(advance_time=False), "real") == []
    d.clock.advance(2.0)
    d.send(StartTurn(1, "s1"))  # releases the pre-roll: ready now, not 2 s ago
    events = d.run(advance_time=False)
    assert late_ms(events, "real") == [0.0, 10.0, 20.0]
    d.clock.advance(3.0)
    d.send(AppendAudio(SILENCE_FRAME[:100]))
    d.clock.advance(1.0)
    d.send(CommitTurn(1, "c1"))  # the partial frame runs zero-padded: ready at the commit
    assert late_ms(d.run(advance_time=False), "commit_tail_padding") == [0.0]


# --- quiet audio queued after the commit feeds the settlement (contract section 7) ----------------------------------

QUIET_FRAME = bytes([0x10, 0x00] * (INPUT_FRAME_BYTES // 2))  # constant 16: about -66 dBFS, below the -40 dBFS gate


def settlement_view(events) -> list[tuple]:
    return [(m.kind, m.transport_frame, m.input_audio, m.turn_state.get("settlement_input_source"))
            for m in metrics(events)]


def test_quiet_frames_sent_after_the_commit_feed_the_settlement_instead_of_zeros():
    d = session(settlement_blank_frames=3)
    d.send(StartTurn(1, "s1"))
    d.send(AppendAudio(LOUD_NOISE_FRAME))  # transport frame 0
    d.send(CommitTurn(1, "c1"))
    d.send(AppendAudio(QUIET_FRAME * 2))  # frames 1 and 2, queued behind the commit
    events = d.run(advance_time=False)
    assert settlement_view(events)[:4] == [
        ("real", 0, True, None),
        ("settlement", 1, True, "queued_microphone_audio"),
        ("settlement", 2, True, "queued_microphone_audio"),
        ("settlement", None, False, "zero"),  # nothing queued any more: zeros, BOS on the third as before
    ]
    # the frames ran once, inside the settlement: none is left to run after the response starts
    assert [m.transport_frame for m in metrics(events, "real")] == [0]
    assert names(events)[-4:] == ["TurnCommitted", "SpeechStopped", "TranscriptCompleted", "ResponseCreated"]


def test_the_settlement_takes_the_same_positions_with_queued_quiet_audio_as_with_zeros():
    runs = []
    for after_commit in (b"", QUIET_FRAME * 5):
        d = session(settlement_blank_frames=3)
        d.events.clear()
        spoken_turn(d, 1, "Hello world")
        if after_commit:
            d.send(AppendAudio(after_commit))
        d.run()
        runs.append((protocol(d.events), [m.kind for m in metrics(d.events)]))
    (zeros, zero_kinds), (quiet, quiet_kinds) = runs
    assert quiet == zeros  # the same turn, transcript and response
    # the five frames replaced zeros: the same settlement positions, none run after it
    assert quiet_kinds.count("settlement") == zero_kinds.count("settlement") == 3
    assert quiet_kinds.count("real") == zero_kinds.count("real") + 2


def test_speech_after_the_commit_ends_the_quiet_input_and_runs_after_the_response_starts():
    d = session(settlement_blank_frames=3)
    d.send(StartTurn(1, "s1"))
    d.send(AppendAudio(LOUD_NOISE_FRAME))  # 0
    d.send(CommitTurn(1, "c1"))
    d.send(AppendAudio(QUIET_FRAME + LOUD_NOISE_FRAME + QUIET_FRAME))  # 1 quiet, 2 speech, 3 quiet
    events = d.run(advance_time=False)
    view = settlement_view(events)
    assert view[:5] == [
        ("real", 0, True, None),
        ("settlement", 1, True, "queued_microphone_audio"),
        ("settlement", None, False, "zero"),  # speech at the head: never crossed
        ("settlement", None, False, "zero"),
        ("real", 2, True, None),  # after the BOS position, in order
    ]
    assert view[5] == ("real", 3, True, None)  # the quiet frame behind the speech is not taken either
    created = [type(e).__name__ for e in events].index("ResponseCreated")
    second_real = [i for i, e in enumerate(events) if isinstance(e, PositionMetrics) and e.transport_frame == 2][0]
    assert created < second_real


def test_the_settlement_never_crosses_a_barrier_queued_after_the_commit():
    d = session(settlement_blank_frames=3)
    d.send(StartTurn(1, "s1"))
    d.send(AppendAudio(LOUD_NOISE_FRAME))  # 0
    d.send(CommitTurn(1, "c1"))
    d.send(AppendAudio(QUIET_FRAME))  # 1: taken
    d.send(StartTurn(2, "s2"))
    d.send(AppendAudio(QUIET_FRAME))  # 2: behind the turn start, runs in turn 2
    events = d.run(advance_time=False)
    view = settlement_view(events)
    assert view[:4] == [
        ("real", 0, True, None),
        ("settlement", 1, True, "queued_microphone_audio"),
        ("settlement", None, False, "zero"),
        ("settlement", None, False, "zero"),
    ]
    assert ("real", 2, True, None) in view[4:]


def test_a_queued_frame_feeding_the_settlement_is_late_from_when_it_was_read():
    d = session(settlement_blank_frames=3)
    d.send(StartTurn(1, "s1"))
    d.send(AppendAudio(LOUD_NOISE_FRAME))
    d.send(CommitTurn(1, "c1"))
    d.dispatch(d.session.receive(AppendAudio(QUIET_FRAME), d.clock.now, arrived=d.clock.now - 0.05))
    events = d.run(advance_time=False)
    fed = [m for m in metrics(events, "settlement") if m.input_audio]
    assert [m.turn_state["late_ms"] for m in fed] == [60.0]  # read 50 ms before, then the real frame's 10 ms step


# --- a settlement position may wait for the client's next frame (settlement_await_s) ---------------------------------


def committed_between_frames(*, since_last_frame: float, await_s: float = 0.04, batched_with: int = 4):
    """Turn 1: one loud frame read at t0, its position run (10 ms a step) on a model home that batches it with
    ``batched_with`` sessions' positions, then the commit ``since_last_frame`` after the frame was read; the host ran
    until it had to wait. Returns the driver and t0."""
    core = SessionCore(SessionConfig(session_id=SID, settlement_blank_frames=3, settlement_await_s=await_s))
    d = SyncDriver(core, BatchedModel(batched_with), synthesizer=SimulatorSynthesizer(), step_seconds=0.01)
    d.send(Configure(SessionPrompt("Be brief.", ())))
    d.send(StartTurn(1, "s1"))
    t0 = d.clock.now
    d.send(AppendAudio(LOUD_NOISE_FRAME))
    d.run(advance_time=False)
    d.clock.advance(since_last_frame - (d.clock.now - t0))
    d.send(CommitTurn(1, "c1"))
    d.run(advance_time=False)
    return d, t0


def test_a_settlement_position_waits_for_the_next_frame_expected_within_the_window_and_takes_it():
    d, t0 = committed_between_frames(since_last_frame=0.06)  # the next frame is due 20 ms after the commit
    assert metrics(d.events, "settlement") == []  # waiting for it, at most 40 ms
    tick = d.session.poll(d.clock.now)
    assert tick.position is None and tick.wake_at == pytest.approx(t0 + 0.06 + 0.04)
    d.clock.advance(0.02)
    d.send(AppendAudio(QUIET_FRAME))  # frame 1, on time
    events = d.run(advance_time=False)
    assert settlement_view(d.events)[:4] == [
        ("real", 0, True, None),
        ("settlement", 1, True, "queued_microphone_audio"),
        ("settlement", None, False, "zero"),  # the next frame is 70 ms away: zeros at once, as before
        ("settlement", None, False, "zero"),
    ]
    assert [m.transport_frame for m in metrics(events, "real")] == []  # nothing left to run after the response
    assert "ResponseCreated" in names(events)


def test_a_frame_that_does_not_come_costs_the_wait_once_then_zeros():
    d, t0 = committed_between_frames(since_last_frame=0.06)
    d.clock.advance(0.04)  # the wait's end: no frame came (a client that stopped sending)
    d.run(advance_time=False)
    assert settlement_view(d.events)[1:4] == [("settlement", None, False, "zero")] * 3
    assert d.clock.now == pytest.approx(t0 + 0.10 + 3 * 0.01)  # the settlement ran from the wait's end, back to back


def test_a_frame_expected_beyond_the_window_is_not_waited_for_until_it_is_within_it():
    d, t0 = committed_between_frames(since_last_frame=0.02)  # the next frame is due 60 ms after the commit
    assert settlement_view(d.events)[1:] == [("settlement", None, False, "zero")] * 2  # 60 and 50 ms away: at once
    assert d.clock.now == pytest.approx(t0 + 0.04)  # the third: the frame is 40 ms away, within the window
    d.clock.advance(0.04)
    d.send(AppendAudio(QUIET_FRAME))
    d.run(advance_time=False)
    assert settlement_view(d.events)[3] == ("settlement", 1, True, "queued_microphone_audio")

    d, t0 = committed_between_frames(since_last_frame=0.02, await_s=0.0)  # no wait at all: as before
    assert settlement_view(d.events)[1:] == [("settlement", None, False, "zero")] * 3
    assert d.clock.now == pytest.approx(t0 + 0.02 + 3 * 0.01)


def test_a_session_the_model_home_runs_alone_never_waits():
    """Nothing would hold its zero positions (no other session's positions to wait for): waiting would only delay."""
    d, t0 = committed_between_frames(since_last_frame=0.06, batched_with=1)
    assert settlement_view(d.events)[1:] == [("settlement", None, False, "zero")] * 3
    assert d.clock.now == pytest.approx(t0 + 0.06 + 3 * 0.01)
