"""Per-turn timing from a timestamped trace (``bench/metrics.py``): exact examples per dialect and properties."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.bench.metrics import (
    TurnMeter,
    decoded_len,
    measure,
    percentile,
    summarize,
)

R = "resp_1"


def v3_trace() -> list[tuple[float, bool, dict]]:
    return [
        (0.000, True, {"type": "session.update"}),
        (0.010, False, {"type": "session.updated", "session": {"output_audio_sample_rate": 22050}}),
        (1.000, True, {"type": "input_audio_buffer.turn_start", "event_id": "t1", "client_turn_id": 1}),
        (1.010, False, {"type": "input_audio_buffer.turn_started", "client_event_id": "t1"}),
        (1.020, True, {"type": "input_audio_buffer.append", "audio_bytes": 2560}),
        (1.030, False, {"type": "voicechat.metrics", "frame": 0, "over_budget": False}),
        (1.100, True, {"type": "input_audio_buffer.append", "audio_bytes": 2560}),
        (1.150, False, {"type": "voicechat.metrics", "frame": 1, "over_budget": True}),
        (1.160, False, {"type": "voicechat.metrics", "frame": None, "over_budget": True}),  # idle: no position
        (1.200, True, {"type": "input_audio_buffer.commit", "event_id": "c1", "client_turn_id": 1}),
        (1.210, False, {"type": "input_audio_buffer.committed", "client_event_id": "c1"}),
        (1.215, False, {"type": "response.created", "response_id": R}),
        (1.220, False, {"type": "response.output_audio.delta", "response_id": R, "audio_bytes": 3528,
                        "sample_rate": 22050}),
        (1.225, False, {"type": "voicechat.metrics", "frame": 2, "over_budget": False}),
        (1.230, False, {"type": "response.output_text.delta", "response_id": R, "delta": "You"}),
        (1.250, False, {"type": "response.output_audio.delta", "response_id": "other", "audio_bytes": 3528}),
        (1.300, False, {"type": "response.output_audio.delta", "response_id": R, "audio_bytes": 3528}),
        (1.380, False, {"type": "response.output_audio.delta", "response_id": R, "audio_bytes": 3528}),
        (1.400, False, {"type": "response.output_text.done", "response_id": R}),
        (1.410, False, {"type": "response.done", "response_id": R, "status": "completed"}),
    ]


def test_v3_turn_exact():
    turns, errors = measure("v3", v3_trace())
    assert errors == []
    (t,) = turns
    got = t.to_json(with_gaps=True)
    expect = {
        "index": 0, "commit_to_committed_ms": 10.0, "commit_to_response_created_ms": 15.0, "ttft_ms": 30.0,
        "ttfa_ms": 20.0, "audio_span_ms": 160.0, "gap_p50_ms": 80.0, "gap_p99_ms": 80.0, "gap_max_ms": 80.0,
        "audio_ms": 240.0, "audio_rtf": 165.0 / 240.0, "audio_deltas": 3, "text_deltas": 1, "input_frames": 2,
        "text": "You", "response_id": R, "status": "completed", "positions": 3, "over_budget_positions": [1],
        "errors": [], "gaps_ms": [80.0, 80.0],
    }
    assert got.keys() == expect.keys()
    for k, v in expect.items():
        assert got[k] == (pytest.approx(v) if isinstance(v, float) or k == "gaps_ms" else v), k
    assert "gaps_ms" not in t.to_json()
    assert t.ok


def b64(n: int) -> str:
    return base64.b64encode(bytes(n)).decode()


def test_tiered_turn_exact_with_nested_ids_and_base64_audio():
    trace = [
        (0.0, False, {"type": "session.created", "session": {}}),
        (0.0, False, {"type": "session.updated",
                      "session": {"audio": {"output": {"format": {"type": "audio/pcm"}, "sample_rate_hz": 16000}}}}),
        (0.5, True, {"type": "input_audio_buffer.append", "audio": "AAAA"}),
        (0.6, True, {"type": "input_audio_buffer.commit", "event_id": "c"}),
        (0.61, False, {"type": "input_audio_buffer.committed", "item_id": "i"}),
        (0.62, False, {"type": "response.created", "response": {"id": "r9", "status": "in_progress"}}),
        (0.63, False, {"type": "response.output_audio_transcript.delta", "response_id": "r9", "delta": "Hi"}),
        (0.64, False, {"type": "response.output_audio.delta", "response_id": "r9", "delta": b64(2560)}),
        (0.74, False, {"type": "response.output_audio.delta", "response_id": "r9", "delta": b64(2559 * 2)}),
        (0.75, False, {"type": "response.done", "response": {"id": "r9", "status": "completed"}}),
    ]
    (t,), errors = measure("tiered", trace)
    assert errors == []
    assert (t.commit_to_committed_ms, t.commit_to_response_created_ms) == (pytest.approx(10), pytest.approx(20))
    assert (t.ttft_ms, t.ttfa_ms, t.audio_span_ms) == (pytest.approx(30), pytest.approx(40), pytest.approx(100))
    assert t.audio_ms == pytest.approx((1280 + 2559) * 1000 / 16000)
    assert t.audio_rtf == pytest.approx(120 / t.audio_ms)
    assert (t.text, t.response_id, t.status, t.input_frames) == ("Hi", "r9", "completed", 1)
    # the tiered dialect sends no per-position telemetry: not measured, not zero
    assert (t.positions, t.over_budget_positions) == (None, None)


def test_errors_cancelled_responses_and_unfinished_turns():
    meter = TurnMeter("v3")
    meter.feed(0.0, False, {"type": "error", "error": {"code": "invalid_json", "message": "bad"}})
    meter.feed(0.1, True, {"type": "input_audio_buffer.append", "audio_bytes": 2560})
    meter.feed(0.2, True, {"type": "input_audio_buffer.commit"})
    meter.feed(0.3, False, {"type": "error", "error": {"code": "x", "message": "y"}})
    meter.feed(0.4, False, {"type": "response.created", "response_id": "a"})
    meter.feed(0.5, False, {"type": "response.done", "response_id": "a", "status": "cancelled"})
    meter.feed(0.6, True, {"type": "input_audio_buffer.append", "audio_bytes": 2560})
    meter.feed(0.7, True, {"type": "input_audio_buffer.commit"})
    with pytest.raises(ValueError, match="backwards"):
        meter.feed(0.69, False, {"type": "response.created", "response_id": "b"})
    turns = meter.finish()
    assert meter.errors == ["error invalid_json: bad"]
    assert [t.errors for t in turns] == [["error x: y", "response a ended cancelled"],
                                         ["session ended before response.done"]]
    assert [t.status for t in turns] == ["cancelled", None]
    assert not any(t.ok for t in turns)
    assert turns[1].commit_to_response_created_ms is None and turns[1].ttfa_ms is None


def test_events_before_a_commit_time_nothing():
    turns, _ = measure("v3", [
        (0.0, False, {"type": "response.created", "response_id": "self"}),  # a self-started response
        (0.1, False, {"type": "response.output_audio.delta", "response_id": "self", "audio_bytes": 10}),
        (0.2, False, {"type": "response.done", "response_id": "self", "status": "completed"}),
    ])
    assert turns == []


def test_unknown_dialect_is_refused():
    with pytest.raises(ValueError, match="dialect"):
        TurnMeter("v2")


@given(st.binary(max_size=300))
def test_decoded_len_matches_base64(data):
    assert decoded_len(base64.b64encode(data).decode()) == len(data)


@given(st.lists(st.floats(-1e6, 1e6), max_size=40), st.floats(0, 100))
def test_percentile_is_numpy_linear(values, q):
    got = percentile(values, q)
    if not values:
        assert got is None
    else:
        assert got == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-6)


ms = st.integers(0, 400)  # whole milliseconds keep the expected values exact

turn_plan = st.fixed_dictionaries({
    "frames": st.integers(1, 5),
    "commit_after": ms, "committed": ms, "created": ms, "text": ms, "audio": ms,
    "gaps": st.lists(st.integers(0, 200), max_size=8),
    "done_after": ms,
    "over": st.lists(st.booleans(), max_size=6),
    "foreign": st.booleans(),
})


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["v3", "tiered"]), st.lists(turn_plan, min_size=1, max_size=4))
def test_meter_recovers_every_generated_interval(dialect, plans):
    trace: list[tuple[float, bool, dict]] = []
    now = 0

    def at(dt: int, sent: bool, event: dict) -> None:
        nonlocal now
        now += dt
        trace.append((now / 1000, sent, event))

    frame = 0
    for i, p in enumerate(plans):
        rid = f"r{i}"
        for _ in range(p["frames"]):
            at(80, True, {"type": "input_audio_buffer.append", "audio_bytes": 2560})
        for over in p["over"]:
            at(1, False, {"type": "voicechat.metrics", "frame": frame, "over_budget": over})
            frame += 1
        at(p["commit_after"], True, {"type": "input_audio_buffer.commit"})
        at(p["committed"], False, {"type": "input_audio_buffer.committed"})
        at(p["created"], False, {"type": "response.created", "response_id": rid})
        at(p["text"], False, {"type": "response.output_text.delta", "response_id": rid, "delta": "w"})
        at(p["audio"], False, {"type": "response.output_audio.delta", "response_id": rid, "audio_bytes": 3528,
                               "sample_rate": 22050})
        for g in p["gaps"]:
            if p["foreign"]:
                at(0, False, {"type": "response.output_audio.delta", "response_id": "x", "audio_bytes": 2})
            at(g, False, {"type": "response.output_audio.delta", "response_id": rid, "audio_bytes": 3528,
                          "sample_rate": 22050})
        at(p["done_after"], False, {"type": "response.done", "response_id": rid, "status": "completed"})
    turns, errors = measure(dialect, trace)
    assert errors == [] and len(turns) == len(plans)
    for t, p in zip(turns, plans):
        assert t.ok and t.input_frames == p["frames"]
        assert t.commit_to_committed_ms == pytest.approx(p["committed"])
        assert t.commit_to_response_created_ms == pytest.approx(p["committed"] + p["created"])
        assert t.ttft_ms == pytest.approx(p["committed"] + p["created"] + p["text"])
        assert t.ttfa_ms == pytest.approx(p["committed"] + p["created"] + p["text"] + p["audio"])
        assert t.audio_span_ms == pytest.approx(sum(p["gaps"]))
        assert t.gaps_ms == pytest.approx(p["gaps"])
        assert t.audio_deltas == len(p["gaps"]) + 1 and t.audio_ms == pytest.approx(80 * t.audio_deltas)
        assert t.audio_rtf == pytest.approx((p["text"] + p["audio"] + sum(p["gaps"])) / t.audio_ms)
        if dialect == "v3":
            assert t.positions == len(p["over"])
            assert len(t.over_budget_positions) == sum(p["over"])
        else:
            assert t.positions is None and t.over_budget_positions is None
    summary = summarize(turns, sessions=1)
    assert summary["turns"] == summary["completed_turns"] == len(plans)
    assert summary["inter_delta_gap_ms"]["count"] == sum(len(p["gaps"]) for p in plans)
    assert summary["ttfa_ms"]["count"] == len(plans)
    assert summary["errors"] == 0
    assert summary["over_budget_positions"] == (sum(sum(p["over"]) for p in plans) if dialect == "v3" else None)


def test_summarize_aggregates_over_all_turns_and_counts_errors():
    a, _ = measure("v3", v3_trace())
    b, _ = measure("v3", v3_trace())
    b[0].errors.append("boom")
    s = summarize(a + b, sessions=2, failed_sessions=1, session_errors=["connect failed"], duration_s=3.0)
    assert (s["sessions"], s["failed_sessions"], s["turns"], s["completed_turns"]) == (2, 1, 2, 1)
    assert s["ttfa_ms"] == {"count": 2, "mean": pytest.approx(20), "p50": pytest.approx(20),
                            "p90": pytest.approx(20), "p99": pytest.approx(20), "max": pytest.approx(20)}
    assert s["inter_delta_gap_ms"]["count"] == 4
    assert (s["positions"], s["over_budget_positions"]) == (6, 2)
    assert (s["errors"], s["error_messages"]) == (2, ["boom", "connect failed"])
    assert s["audio_ms_total"] == pytest.approx(480) and s["duration_s"] == 3.0
    empty = summarize([], sessions=0)
    assert empty["ttfa_ms"] == {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    assert empty["over_budget_positions"] is None
