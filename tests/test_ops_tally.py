"""The operators' counters: a session's tally, the server's usage book and the Prometheus collector,
on the virtual clock. The tally must agree exactly with what the wire carried."""

from __future__ import annotations

import base64
import json

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.ops.prometheus import VoicechatCollector
from vllm_omni_voicechat.ops.tally import LATENCY_BUCKETS_S, Histogram, SessionTally
from vllm_omni_voicechat.ops.usage import UsageBook
from vllm_omni_voicechat.session import events as ev
from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.shell.sync import SyncDriver
from vllm_omni_voicechat.sim.model import SimulatorModel
from vllm_omni_voicechat.synth.simulated import SimulatorSynthesizer
from vllm_omni_voicechat.wire.transport import WireText
from vllm_omni_voicechat.wire.v3 import V3Options, V3Session


def metrics(frame, kind="real", step_ms=10.0, over=False, audio_in=True, late_ms=0.0) -> ev.PositionMetrics:
    return ev.PositionMetrics(frame, frame, kind, 1.0, step_ms, 80.0, over, audio_in, True, True, None, None,
                              {"late_ms": late_ms})


def test_histogram_buckets_are_cumulative_with_inf_and_merge_bucketwise():
    h = Histogram((0.1, 0.5))
    for v in (0.05, 0.1, 0.3, 0.7, 9.0):
        h.observe(v)
    assert h.cumulative() == [("0.1", 2), ("0.5", 3), ("+Inf", 5)]  # le is inclusive
    assert h.count == 5 and h.sum == pytest.approx(10.15)
    other = Histogram((0.1, 0.5))
    other.observe(0.2)
    h.merge(other)
    assert h.cumulative() == [("0.1", 2), ("0.5", 4), ("+Inf", 6)]
    with pytest.raises(ValueError):
        h.merge(Histogram((1.0,)))


def test_a_position_started_half_a_frame_late_is_counted_late():
    t = SessionTally("tiered", started_at=0.0)
    for frame, late_ms in enumerate((0.0, 39.9, 40.0, 250.0)):
        t.observe(metrics(frame, late_ms=late_ms), 0.08 * frame)
    t.observe(metrics(None, late_ms=500.0), 1.0)  # an idle frame ran no position
    assert t.late == 2 and t.summary()["late_positions"] == 2


def test_a_tally_counts_positions_latencies_and_outcomes_exactly():
    t = SessionTally("v3", started_at=100.0)
    t.observe(metrics(None), 100.0)  # a gated idle frame: liveness only, no model position
    t.observe(metrics(0), 100.08)
    t.observe(metrics(1, kind="settlement", step_ms=95.0, over=True, audio_in=False, late_ms=39.9), 100.16)
    t.observe(metrics(None, late_ms=500.0), 100.17)  # an idle frame is never a late position
    t.observe(ev.TurnCommitted("turn_1", 1, "c1"), 100.20)
    t.observe(ev.ResponseCreated("turn_1", "resp_1"), 100.26)
    t.observe(ev.AudioDelta("turn_1", "resp_1", bytes(2 * 1764)), 100.40)
    t.observe(ev.AudioDelta("turn_1", "resp_1", bytes(2 * 1764)), 100.48)  # not a first audio
    t.observe(ev.ResponseDone("turn_1", "resp_1", "completed", "eos"), 100.5)
    t.observe(ev.FunctionCallPublished("turn_1", "resp_1", "call_1", "f", "{}"), 100.6)
    t.observe(ev.FunctionOutputApplied("call_1"), 100.7)
    t.observe(ev.FunctionCallFailed("turn_1", "resp_1", "call_2", "x"), 100.7)
    t.observe(ev.Error("function_call_loop_limit", "m", True), 100.8)
    t.observe(ev.TypedInjectionFinished("job", "replaced"), 100.9)
    t.observe(ev.TypedRejected("job2", "typed_input_busy"), 100.9)
    t.observe(ev.Prefill(None), 101.0)  # effects are not counted  # type: ignore[arg-type]
    t.wire_error("invalid_json")
    assert dict(t.positions) == {"real": 1, "settlement": 1}
    assert t.over_budget == 1 and t.late == 0 and t.input_frames == 1 and t.audio_in_s == pytest.approx(0.08)
    assert t.step.count == 2 and t.step.sum == pytest.approx(0.105)
    assert t.commit_to_created.count == 1 and t.commit_to_created.sum == pytest.approx(0.06)
    assert t.commit_to_first_audio.count == 1 and t.commit_to_first_audio.sum == pytest.approx(0.20)
    assert t.audio_out_s == pytest.approx(0.16)
    assert dict(t.responses) == {"completed": 1}
    assert dict(t.function_calls) == {"published": 1, "applied": 1, "failed": 1, "loop_limit": 1}
    assert dict(t.typed_jobs) == {"replaced": 1, "rejected": 1}
    assert dict(t.errors) == {"function_call_loop_limit": 1, "invalid_json": 1}


def test_a_model_owned_turn_is_sealed_by_the_end_of_speech_and_a_typed_one_is_not():
    t = SessionTally("tiered", 0.0)
    t.observe(ev.SpeechStopped("turn_1", "microphone", None), 1.0)
    t.observe(ev.SpeechStopped("turn_2", "typed", "job"), 1.0)
    t.observe(ev.ResponseCreated("turn_1", "r1"), 1.5)
    t.observe(ev.ResponseCreated("turn_2", "r2"), 1.5)
    assert t.commit_to_created.count == 1 and t.commit_to_created.sum == pytest.approx(0.5)


def test_open_commits_are_bounded():
    t = SessionTally("v3", 0.0)
    for i in range(500):  # commits that never get a response (cleared, auto_response off)
        t.observe(ev.TurnCommitted(f"turn_{i}", i, f"c{i}"), float(i))
    assert len(t._commits) == 64


def test_the_usage_book_folds_a_session_once_and_merges_by_key():
    book = UsageBook(0.0)
    a = book.admit("A", "v3", 1.0)
    b = book.admit("B", "v3", 2.0)
    a.observe(ev.ResponseDone("t", "r", "completed", ""), 3.0)
    b.observe(ev.ResponseDone("t", "r", "cancelled", ""), 3.0)
    b.wire_error("invalid_json")
    a.late_inbox, b.late_inbox = 2, 1  # the shell counts these (shell/aio.py)
    book.reject("v3", "busy")
    book.end("A", "client_stop", 5.0)
    book.end("A", "disconnect", 6.0)  # a second end changes nothing
    assert book.totals()["v3"].responses == {"completed": 1, "cancelled": 1}  # the ended one plus the live one
    book.end("B", "disconnect", 7.0)
    report = book.to_json(10.0)
    assert report["sessions"] == {"admitted": {"v3": 2}, "rejected": {"v3": {"busy": 1}},
                                  "ended": {"v3": {"client_stop": 1, "disconnect": 1}}, "live": 0}
    assert report["total"]["responses"] == {"cancelled": 1, "completed": 1}
    assert report["total"]["errors"] == {"invalid_json": 1}
    assert report["total"]["late_inbox_messages"] == 3
    assert [(s["ended_reason"], s["duration_s"]) for s in report["ended_sessions"]] == [("client_stop", 4.0),
                                                                                         ("disconnect", 5.0)]
    assert book.mean_duration_s() == pytest.approx(4.5)


def _v3_turn(tally: SessionTally) -> list[dict]:
    """A spoken v3 turn, a malformed frame and a stop on the sync host; returns the wire events."""
    session = V3Session(SessionCore(SessionConfig(session_id="S", settlement_blank_frames=3)), V3Options(),
                        tally=tally)
    out: list = []
    host = SyncDriver(session, SimulatorModel(), synthesizer=SimulatorSynthesizer(), on_event=out.append,
                      keep=False, step_seconds=0.01)
    host.dispatch(session.start(host.clock.now))

    def send(event: dict | str) -> None:
        host.dispatch(session.receive(event if isinstance(event, str) else json.dumps(event), host.clock.now))
        host.run(max_positions=400, stop_when=lambda: session.core.idle)  # not on to the silent client's deadline

    send({"type": "session.update", "event_id": "u", "session": {"protocol_version": 3, "instructions": "Hi."}})
    send({"type": "input_audio_buffer.turn_start", "event_id": "s", "client_turn_id": 1})
    send({"type": "input_audio_buffer.append", "event_id": "a", "encoding": "pcm16", "sample_rate": 16000,
          "channels": 1, "audio": base64.b64encode(render_speech("hello")).decode()})
    send({"type": "input_audio_buffer.commit", "event_id": "c", "client_turn_id": 1})
    send("{not json")
    send({"type": "session.stop", "event_id": "x"})
    return [json.loads(o.text) for o in out if isinstance(o, WireText)]


def test_a_v3_sessions_tally_agrees_with_its_wire_trace():
    tally = SessionTally("v3", 0.0)
    wire = _v3_turn(tally)
    positions = [e for e in wire if e["type"] == "voicechat.metrics" and e["frame"] is not None]
    kinds: dict[str, int] = {}
    for e in positions:
        kind = e["turn_state"]["kind"]
        kinds[kind] = kinds.get(kind, 0) + 1
    assert dict(tally.positions) == kinds and tally.position_count > 10
    assert tally.over_budget == sum(1 for e in positions if e["over_budget"])
    done = [e["status"] for e in wire if e["type"] == "response.done"]
    assert done == ["completed"] and dict(tally.responses) == {"completed": 1}
    assert dict(tally.errors) == {e["error"]["code"]: 1 for e in wire if e["type"] == "error"} == {"invalid_json": 1}
    audio = sum(len(base64.b64decode(e["delta"])) // 2 for e in wire if e["type"] == "response.output_audio.delta")
    assert tally.output_samples == audio > 0
    assert tally.commit_to_created.count == 1 == tally.commit_to_first_audio.count


def test_the_collector_exposes_the_books_in_prometheus_conventions():
    class Server:
        def __init__(self) -> None:
            self.usage = UsageBook(0.0)

        def operator_gauges(self) -> dict[str, float]:
            return {"active": 1, "detached": 0, "queued": 2, "journal_bytes": 1234}

    server = Server()
    _v3_turn(server.usage.admit("S", "v3", 0.0))
    server.usage.end("S", "client_stop", 60.0)
    live = server.usage.admit("L", "tiered", 61.0)
    live.wire_error("invalid_json")
    server.usage.reject("v3", "busy")
    server.usage.resumed(0.004)
    registry = CollectorRegistry()
    registry.register(VoicechatCollector([server]))
    text = generate_latest(registry).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("voicechat_sessions", state="queued") == 2 and value("voicechat_journal_bytes") == 1234
    assert value("voicechat_sessions_admitted_total", dialect="v3") == 1
    assert value("voicechat_sessions_admitted_total", dialect="tiered") == 1
    assert value("voicechat_sessions_rejected_total", dialect="v3", reason="busy") == 1
    assert value("voicechat_sessions_ended_total", dialect="v3", reason="client_stop") == 1
    assert value("voicechat_responses_total", dialect="v3", status="completed") == 1
    assert value("voicechat_errors_total", dialect="v3", code="invalid_json") == 1
    assert value("voicechat_errors_total", dialect="tiered", code="invalid_json") == 1  # a live session counts
    positions = sum(v for (n, _), v in samples.items() if n == "voicechat_model_positions_total")
    assert positions == value("voicechat_model_step_seconds_count", dialect="v3") > 10
    assert value("voicechat_commit_to_first_audio_seconds_count", dialect="v3") == 1
    top = repr(float(LATENCY_BUCKETS_S[-1]))
    assert value("voicechat_commit_to_first_audio_seconds_bucket", dialect="v3", le=top) == 1
    assert value("voicechat_resume_replay_seconds_count") == 1
    assert not [k for k in samples if any(label == "session_id" for label, _ in k[1])]
    assert all(name.startswith("voicechat_") for name, _ in samples)
