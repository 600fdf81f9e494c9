"""The trace invariant checker itself: traces that must pass, and each invariant's violation detected.

Hand-written traces pin each rule (R1-R6 in ``vllm_omni_voicechat/trace/checker.py``); hypothesis generates valid
v3 and tiered traces (random turns, responses, metrics and rejected client events) that must pass, and then breaks
one guarantee at a random place, which must be reported.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.trace import TraceChecker, TraceViolation

SID = "S"


class V3:
    """A v3 server-event factory with the envelope filled in."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, type_: str, **fields) -> dict:
        self.n += 1
        return {"type": type_, "event_id": f"evt_{SID}_{self.n}", "session_id": SID, **fields}

    def error(self, code: str, *, fatal: bool = False, echo=None) -> dict:
        body = {"code": code, "message": code, "fatal": fatal}
        if echo is not None:
            body["client_event_id"] = echo
        return self("error", error=body)


def feed(checker: TraceChecker, trace: list) -> TraceChecker:
    for kind, item in trace:
        if kind == "C":
            checker.client_event(item if isinstance(item, (str, bytes)) else json.dumps(item))
        elif kind == "S":
            checker.server_event(item)
        else:
            checker.transport_closed(item)
    return checker


def v3_turn(e: V3, k: int, *, stop_at: str | None = None) -> list:
    """One microphone turn with its response (client barriers included)."""
    t, r = f"turn_{SID}_{k}", f"response_{SID}_{k}"
    trace = [
        ("C", {"type": "input_audio_buffer.turn_start", "event_id": f"ts{k}", "client_turn_id": k}),
        ("S", e("input_audio_buffer.speech_started", turn_id=t, source="microphone", job_id=None, correlation=k)),
        ("S", e("input_audio_buffer.turn_started", client_event_id=f"ts{k}", client_turn_id=k, turn_id=t)),
        ("C", {"type": "input_audio_buffer.append", "event_id": f"a{k}", "encoding": "pcm16", "sample_rate": 16000,
               "channels": 1, "audio": "AAAAAA=="}),
        ("S", e("voicechat.metrics", frame=k, response_id=None)),
        ("C", {"type": "input_audio_buffer.commit", "event_id": f"c{k}", "client_turn_id": k}),
        ("S", e("input_audio_buffer.committed", client_event_id=f"c{k}", client_turn_id=k, turn_id=t)),
        ("S", e("input_audio_buffer.speech_stopped", turn_id=t, source="microphone", job_id=None)),
        ("S", e("conversation.item.input_audio_transcription.completed", turn_id=t, transcript="", empty=True,
                source="microphone", job_id=None)),
        ("S", e("response.created", turn_id=t, response_id=r)),
        ("S", e("response.output_text.delta", turn_id=t, response_id=r, delta="hi", text="hi")),
        ("S", e("response.output_audio.delta", turn_id=t, response_id=r, delta="AAAA", encoding="pcm16",
                sample_rate=22050, channels=1)),
        ("S", e("response.output_text.done", turn_id=t, response_id=r, text="hi", empty=False)),
        ("S", e("response.output_audio.done", turn_id=t, response_id=r, empty=False)),
        ("S", e("response.done", turn_id=t, response_id=r, status="completed", reason="post_eos_audio_silence")),
    ]
    return trace


def v3_open(e: V3) -> list:
    return [
        ("S", e("session.created", protocol={"name": "voicechat.realtime", "version": 3})),
        ("C", {"type": "session.update", "event_id": "u1", "session": {"protocol_version": 3}}),
        ("S", e("session.updated")),
    ]


def v3_stop(e: V3) -> list:
    return [("C", {"type": "session.stop", "event_id": "stop"}),
            ("S", e("session.closed", status="completed", reason="client_stop")), ("X", 1000)]


def golden_v3() -> list:
    e = V3()
    return v3_open(e) + v3_turn(e, 1) + v3_turn(e, 2) + v3_stop(e)


def check(trace: list, dialect: str = "v3", **kw) -> list[str]:
    c = feed(TraceChecker(dialect, **kw), trace)  # type: ignore[arg-type]
    c.finish()
    return c.violations


def test_golden_v3_trace_passes():
    assert check(golden_v3()) == []
    c = feed(TraceChecker("v3"), golden_v3())
    c.check()  # no raise


def test_check_raises_with_the_listing():
    trace = golden_v3()
    trace = [x for x in trace if not (x[0] == "S" and x[1]["type"] == "response.done")]
    c = feed(TraceChecker("v3", name="t"), trace)
    with pytest.raises(TraceViolation) as info:
        c.check()
    assert "trace t:" in str(info.value) and "recent frames" in str(info.value)


# ============================================================================================= R1 responses


def _drop(trace: list, type_: str, nth: int = 0) -> list:
    hits = [i for i, x in enumerate(trace) if x[0] == "S" and x[1]["type"] == type_]
    i = hits[nth]
    return trace[:i] + trace[i + 1:]


def test_missing_response_done_is_reported_at_the_server_close():
    v = check(_drop(golden_v3(), "response.done", 1))
    assert any("never reached response.done" in s or "while response" in s for s in v), v


def test_second_response_done_is_reported():
    trace = golden_v3()
    i = next(i for i, x in enumerate(trace) if x[0] == "S" and x[1]["type"] == "response.done")
    dup = dict(trace[i][1], event_id="evt_dup")
    v = check(trace[: i + 1] + [("S", dup)] + trace[i + 1:])
    assert any("a second response.done" in s for s in v), v


def test_two_open_responses_are_reported():
    v = check(_drop(golden_v3(), "response.done", 0))
    assert any("created while response_S_1 is still open" in s for s in v), v


def test_delta_after_terminal_is_a_superseded_event():
    e = V3()
    trace = v3_open(e) + v3_turn(e, 1)
    trace.append(("S", e("response.output_audio.delta", turn_id=f"turn_{SID}_1", response_id=f"response_{SID}_1",
                         delta="AAAA")))
    v = check(trace)
    assert any("after its terminal" in s for s in v), v


def test_reused_response_id_is_reported():
    e = V3()
    trace = v3_open(e) + v3_turn(e, 1)
    trace += [("S", e("response.created", turn_id="t9", response_id=f"response_{SID}_1"))]
    assert any("reused" in s for s in check(trace))


# ============================================================================================= R2 v3 turns


def test_response_created_before_committed_is_reported():
    trace = golden_v3()
    i = next(i for i, x in enumerate(trace) if x[0] == "S" and x[1]["type"] == "input_audio_buffer.committed")
    j = next(i for i, x in enumerate(trace) if x[0] == "S" and x[1]["type"] == "response.created")
    moved = trace[:i] + trace[i + 1: j + 1] + [trace[i]] + trace[j + 1:]
    v = check(moved)
    assert any("created before input_audio_buffer.committed" in s for s in v), v


def test_barrier_ack_must_echo_the_barrier():
    trace = golden_v3()
    i = next(i for i, x in enumerate(trace) if x[0] == "S" and x[1]["type"] == "input_audio_buffer.turn_started")
    bad = dict(trace[i][1], client_event_id="someone-else")
    v = check(trace[:i] + [("S", bad)] + trace[i + 1:])
    assert any("which no unacknowledged client barrier" in s for s in v), v


# ============================================================================================= R4 tiered seq


def tiered(type_: str, seq: int | None, **fields) -> dict:
    event = {"type": type_, "event_id": f"event_{type_}_{seq}", **fields}
    if seq is not None:
        event["server_event_seq"] = seq
    return event


def tiered_turn(first_seq: int, rid: str, epoch: int = 0) -> list:
    s = first_seq
    return [
        ("S", tiered("response.created", s, response_id=rid, response={"id": rid, "metadata": {"epoch": epoch}})),
        ("S", tiered("response.output_audio.delta", s + 1, response_id=rid, metadata={"epoch": epoch})),
        ("S", tiered("response.output_audio.done", s + 2, response_id=rid)),
        ("S", tiered("response.done", s + 3, response_id=rid, response={"id": rid, "status": "completed",
                                                                         "metadata": {"epoch": epoch}})),
        ("S", tiered("rate_limits.updated", s + 4, rate_limits=[])),
    ]


def golden_tiered() -> list:
    return ([("C", {"type": "session.update", "session": {}}),
             ("S", tiered("session.created", None, session={"id": "duplex-1"})),
             ("S", tiered("session.updated", 1, session={}))]
            + tiered_turn(2, "resp_1") + tiered_turn(7, "resp_2")
            + [("C", {"type": "session.close"}),
               ("S", tiered("session.closed", 12, reason="client_close")), ("X", 1000)])


def test_golden_tiered_trace_passes():
    assert check(golden_tiered(), "tiered") == []


def test_seq_gap_and_repeat_are_reported():
    trace = golden_tiered()
    gap = _drop(trace, "rate_limits.updated", 0)
    assert any("server_event_seq 7, expected 6" in s for s in check(gap, "tiered"))
    i = next(i for i, x in enumerate(trace) if x[0] == "S" and x[1].get("server_event_seq") == 4)
    repeat = trace[: i + 1] + [("S", dict(trace[i][1], event_id="other"))] + trace[i + 1:]
    assert any("server_event_seq 4, expected 5" in s for s in check(repeat, "tiered"))


def test_resumed_socket_starts_after_the_cursor():
    ok = [("C", {"type": "session.resume", "session_id": "d", "resume_token": "rt", "last_received_server_event_seq": 4}),
          ("S", tiered("session.resumed", None, session={})),
          ("S", tiered("response.output_audio.done", 5, response_id="resp_1")),  # opened on the previous socket
          ("S", tiered("response.done", 6, response_id="resp_1", response={"id": "resp_1", "status": "completed"})),
          ("S", tiered("rate_limits.updated", 7))]
    assert check(ok, "tiered") == []
    late = [ok[0], ok[1], *ok[3:]]
    assert any("server_event_seq 6, expected 5" in s for s in check(late, "tiered"))


def test_session_stream_is_plus_one_across_resumes():
    c = TraceChecker("tiered", stream="session")
    for x in golden_tiered()[:-3]:
        if x[0] == "S":
            c.server_event(x[1])
    c.client_event(json.dumps({"type": "session.resume", "session_id": "d", "resume_token": "rt"}))
    c.server_event(tiered("session.resumed", None))
    c.server_event(tiered("rate_limits.updated", 13))
    assert any("server_event_seq 13, expected 12" in s for s in c.violations)


def test_epoch_going_back_is_a_superseded_epoch():
    trace = golden_tiered()
    trace = trace[:3] + tiered_turn(2, "resp_1", epoch=1) + tiered_turn(7, "resp_2", epoch=0) + trace[-3:]
    assert any("epoch 0 after epoch 1" in s for s in check(trace, "tiered"))


# ============================================================================================= R5 rejections


def test_unanswered_rejection_is_reported_when_settled():
    e = V3()
    c = feed(TraceChecker("v3"), v3_open(e))
    c.client_event("{not json")
    c.settled()
    assert any("never answered (error invalid_json)" in s for s in c.violations), c.violations


@pytest.mark.parametrize(
    ("frame", "code", "echo"),
    [
        (b"\x00\x01", "binary_audio_unsupported", None),
        ("{oops", "invalid_json", None),
        ("null", "invalid_event", None),
        ({"type": "response.create", "event_id": "x1"}, "unsupported_event", "x1"),
        ({"type": "input_audio_buffer.append", "event_id": "x2", "encoding": "pcm16", "sample_rate": 16000,
          "channels": 1, "audio": "!!"}, "invalid_audio", "x2"),
        ({"type": "input_audio_buffer.append", "event_id": "x3", "encoding": "opus"}, "unsupported_audio_encoding",
         "x3"),
        ({"type": "conversation.item.create", "event_id": "x4", "item": []}, "invalid_conversation_item", "x4"),
    ],
)
def test_v3_rejections_need_their_typed_error(frame, code, echo):
    e = V3()
    base = v3_open(e)
    ok = base + [("C", frame), ("S", e.error(code, echo=echo))]
    c = feed(TraceChecker("v3"), ok)
    c.settled()
    assert c.violations == []
    wrong = base + [("C", frame), ("S", e.error("internal_oops", echo=echo))]
    c = feed(TraceChecker("v3"), wrong)
    c.settled()
    assert c.violations, "a wrong or missing typed error must be reported"


def test_answers_are_in_client_order():
    e = V3()
    trace = v3_open(e) + [("C", "{bad"), ("C", {"type": "nope", "event_id": "n1"}),
                          ("S", e.error("unsupported_event", echo="n1"))]
    v = check(trace)
    assert any("#1 (<invalid json>) was not answered before this answer to #2" in s for s in v), v


def test_an_id_the_client_reused_is_not_read_as_the_later_events_wrong_answer():
    """Found by the v3 fuzzer (seeds 1048, 1049, 1092): a function output and then a face-invalid event with the same
    ``event_id``; the output's own error echoes that id first. Which event it answers cannot be told from the id."""
    e = V3()
    output = {"type": "conversation.item.create", "event_id": "m",
              "item": {"type": "function_call_output", "call_id": "c", "output": "o"}}
    trace = v3_open(e) + [("C", output), ("C", {"type": "response.cancel", "event_id": "m"}),
                          ("S", e.error("tools_not_set", echo="m")), ("S", e.error("unsupported_event", echo="m"))]
    c = feed(TraceChecker("v3"), trace)
    c.settled()
    assert c.violations == []
    # An id used once still is: the wrong code is reported.
    e = V3()
    trace = v3_open(e) + [("C", {"type": "response.cancel", "event_id": "m"}), ("S", e.error("tools_not_set", echo="m"))]
    v = check(trace)
    assert any("answered with tools_not_set, expected unsupported_event" in s for s in v), v


def test_error_echoing_an_unknown_id_is_reported():
    e = V3()
    v = check(v3_open(e) + [("S", e.error("invalid_json", echo="never-sent"))])
    assert any("never sent" in s for s in v)


def test_typed_request_is_answered_once():
    e = V3()
    ok = v3_open(e) + [("C", {"type": "input_text.request", "job_id": "j1", "text": "hi"}),
                       ("S", e("input_text.accepted", job_id="j1"))]
    c = feed(TraceChecker("v3"), ok)
    c.settled()
    assert c.violations == []
    c = feed(TraceChecker("v3"), ok + [("S", e("input_text.rejected", job_id="j1", reason="x"))])
    assert any("no unanswered input_text.request" in s for s in c.violations)


def test_input_backpressure_answers_any_event_out_of_order():
    e = V3()
    trace = v3_open(e) + [("C", "{bad"), ("C", {"type": "nope", "event_id": "n1"}),
                          ("S", e.error("input_backpressure", echo="n1")), ("S", e.error("invalid_json"))]
    c = feed(TraceChecker("v3"), trace)
    c.settled()
    assert c.violations == []


def test_tiered_rejections_echo_in_error_event_id():
    ok = golden_tiered()[:3] + [("C", {"type": "input_audio_buffer.append", "event_id": "a1", "audio": "%%"}),
                                ("S", tiered("error", 2, error={"type": "invalid_request_error", "code": "bad_audio",
                                                                "message": "m", "event_id": "a1"}))]
    c = feed(TraceChecker("tiered"), ok)
    c.settled()
    assert c.violations == []
    c = feed(TraceChecker("tiered"), ok[:-1])
    c.settled()
    assert any("bad_audio" in s for s in c.violations)


# ============================================================================================= R6 endings


def test_fatal_needs_its_close_code_and_nothing_after():
    e = V3()
    base = v3_open(e) + [("C", {"type": "input_audio_buffer.commit", "event_id": "c1", "client_turn_id": 1}),
                         ("S", e.error("input_turn_conflict", fatal=True, echo="c1"))]
    assert check(base + [("X", 1002)]) == []
    assert any("close code 1011" in s for s in check(base + [("X", 1011)]))
    assert any("after fatal error input_turn_conflict" in s
               for s in check(base + [("S", e("voicechat.metrics")), ("X", 1002)]))
    assert any("session.closed after fatal input_turn_conflict" in s
               for s in check(base + [("S", e("session.closed", status="failed", reason="input_turn_conflict"))]))


def test_loop_limit_closes_with_session_closed_then_1011():
    e = V3()
    trace = v3_open(e) + v3_turn(e, 1)[:-1] + [
        ("S", e("response.done", turn_id="turn_S_1", response_id="response_S_1", status="failed",
                reason="function_call_loop_limit")),
        ("S", e.error("function_call_loop_limit", fatal=True)),
        ("S", e("session.closed", status="failed", reason="function_call_loop_limit")), ("X", 1011)]
    assert check(trace) == []


def test_fatal_with_an_open_response_is_reported():
    e = V3()
    trace = v3_open(e) + v3_turn(e, 1)[:-1] + [("S", e.error("internal_error", fatal=True)), ("X", 1011)]
    assert any("fatal internal_error while response" in s for s in check(trace))


def test_position_limit_closes_brackets_after_the_error():
    e = V3()
    trace = v3_open(e) + v3_turn(e, 1)[:-3] + [
        ("S", e.error("session_position_limit", fatal=True)),
        ("S", e("response.output_text.done", turn_id="turn_S_1", response_id="response_S_1")),
        ("S", e("response.output_audio.done", turn_id="turn_S_1", response_id="response_S_1")),
        ("S", e("response.done", turn_id="turn_S_1", response_id="response_S_1", status="cancelled")),
        ("S", e("session.closed", status="failed", reason="session_position_limit")), ("X", 1000)]
    assert check(trace) == []


def test_events_after_session_closed_and_close_without_terminal():
    e = V3()
    trace = golden_v3()
    assert any("after session.closed" in s for s in check(trace[:-1] + [("S", e("voicechat.metrics"))]))
    assert any("without a terminal event" in s for s in check(v3_open(e) + [("X", 1000)]))
    assert check(v3_open(V3()) + [("X", None)]) == []  # the client left: nothing owed


def test_peer_gone_tolerates_late_server_events():
    e = V3()
    assert check(v3_open(e) + [("X", None), ("S", e("voicechat.metrics"))]) == []


def test_busy_refusal_and_tiered_handshake_refusals():
    e = V3()
    assert check([("S", e.error("server_busy", fatal=True)), ("X", 1013)]) == []
    refusal = tiered("error", None, error={"type": "rate_limit_error", "code": "resource_exhausted", "message": "m",
                                           "retryable": True})
    assert check([("S", refusal), ("X", 1013)], "tiered") == []
    flat = {"type": "error", "error": "Realtime API is not available", "code": "unsupported"}
    assert check([("S", flat), ("X", 1000)], "tiered") == []
    assert any("first server event" in s for s in check([("S", e("voicechat.metrics"))]))


def test_openai_lane_closes_without_session_closed():
    trace = [x for x in golden_tiered() if not (x[0] == "S" and x[1]["type"] == "session.closed")]
    assert check(trace, "tiered-openai") == []
    assert any("without a terminal" in s for s in check(trace, "tiered"))


# ============================================================================================= generated traces


@st.composite
def v3_traces(draw):
    """A valid v3 trace: turns with responses, metrics and rejected events answered at once, then a stop."""
    e = V3()
    trace = v3_open(e)
    bad_frames = [("{x", "invalid_json", None), ("[]", "invalid_event", None), (b"\x01", "binary_audio_unsupported", None)]
    for k in range(1, draw(st.integers(0, 4)) + 1):
        for _ in range(draw(st.integers(0, 2))):
            frame, code, echo = draw(st.sampled_from(bad_frames))
            if draw(st.booleans()):
                frame, code, echo = {"type": f"x.{k}", "event_id": f"x{k}"}, "unsupported_event", f"x{k}"
            trace += [("C", frame), ("S", e.error(code, echo=echo))]
        turn = v3_turn(e, k)
        for _ in range(draw(st.integers(0, 3))):
            at = draw(st.integers(1, len(turn)))
            turn.insert(at, ("S", e("voicechat.metrics", frame=None)))
        trace += turn
    if draw(st.booleans()):
        trace += v3_stop(e)
    else:
        trace += [("X", None)]
    return trace


@settings(max_examples=150, deadline=None)
@given(v3_traces())
def test_generated_valid_v3_traces_pass(trace):
    c = feed(TraceChecker("v3"), trace)
    c.settled()
    c.check()


@settings(max_examples=150, deadline=None)
@given(v3_traces(), st.data())
def test_generated_broken_v3_traces_are_caught(trace, data):
    server = [i for i, x in enumerate(trace) if x[0] == "S" and x[1]["type"] in
              ("response.done", "response.created", "input_audio_buffer.committed", "error", "session.closed")]
    if not server:
        return
    i = data.draw(st.sampled_from(server))
    event = trace[i][1]
    # an extra error is not detectable in general (errors also report server-side conditions)
    kind = "drop" if event["type"] == "error" else data.draw(st.sampled_from(["drop", "duplicate"]))
    if kind == "drop":
        broken = trace[:i] + trace[i + 1:]
    else:
        broken = trace[: i + 1] + [("S", dict(event, event_id="evt_dup"))] + trace[i + 1:]
    c = feed(TraceChecker("v3"), broken)
    c.settled()
    c.finish()
    later_created = any(x[0] == "S" and x[1]["type"] == "response.created" for x in trace[i + 1:])
    if kind == "drop" and event["type"] == "response.done" and trace[-1] == ("X", None) and not later_created:
        assert c.violations == []  # the client left mid-response: the server owed no terminal
    elif kind == "drop" and event["type"] == "session.closed":
        assert c.violations  # the close 1000 then has no terminal
    elif kind == "drop" and event["type"] == "response.created":
        assert c.violations  # its deltas name a response that is not open
    else:
        assert c.violations, (kind, event["type"])


@st.composite
def tiered_traces(draw):
    turns = draw(st.integers(0, 4))
    trace = [("C", {"type": "session.update", "session": {}}), ("S", tiered("session.created", None)),
             ("S", tiered("session.updated", 1))]
    seq, epoch = 2, 0
    for k in range(turns):
        if draw(st.booleans()):
            epoch += 1
        trace += tiered_turn(seq, f"resp_{k}", epoch)
        seq += 5
    trace += [("C", {"type": "session.close"}), ("S", tiered("session.closed", seq, reason="client_close")),
              ("X", 1000)]
    return trace


@settings(max_examples=100, deadline=None)
@given(tiered_traces(), st.data())
def test_generated_tiered_traces_pass_and_any_lost_event_is_caught(trace, data):
    assert check(trace, "tiered") == []
    seqd = [i for i, x in enumerate(trace) if x[0] == "S" and x[1].get("server_event_seq") is not None]
    i = data.draw(st.sampled_from(seqd[:-1]))  # the last one's loss is invisible to a per-socket checker
    assert check(trace[:i] + trace[i + 1:], "tiered"), "a lost journaled event breaks the +1 rule"


def test_a_checker_error_is_reported_not_raised():
    """The tap runs inside the server: whatever the server sends, the checker itself never raises."""
    e = V3()
    c = feed(TraceChecker("v3"), v3_open(e))
    c.server_event(e("error", error={"code": {"not": "hashable"}, "message": "m", "fatal": True}))
    assert any("checker error" in v for v in c.violations), c.violations


# ============================================================================================= R7 admission queue


def queued(*positions: int, done: bool = True) -> list:
    events = [("S", tiered("session.queued", None, position=positions[0], estimated_wait_s=None))]
    events += [("S", {**tiered("session.queue_update", None, position=p, estimated_wait_s=1.0),
                      "event_id": f"event_queue_{i}"}) for i, p in enumerate(positions[1:])]
    if done:
        events.append(("S", tiered("session.queue_done", None, position=0, estimated_wait_s=None)))
    return events


def test_a_queued_session_passes():
    trace = golden_tiered()
    assert check(trace[:1] + queued(3, 2, 1) + trace[1:], "tiered") == []


@pytest.mark.parametrize(("events", "expected"), [
    (queued(2, 3), "queue position 2 -> 3 (must move up)"),
    (queued(2, 2), "queue position 2 -> 2 (must move up)"),
    (queued(1, done=False), "session.created while queued"),
    ([("S", tiered("session.queue_done", None, position=0, estimated_wait_s=None))],
     "session.queue_done without session.queued"),
    (queued(0), "session.queued twice or at position 0"),
])
def test_queue_violations_are_reported(events, expected):
    trace = golden_tiered()
    assert any(expected in v for v in check(trace[:1] + events + trace[1:], "tiered"))


def test_queue_events_after_the_session_began_are_reported():
    trace = golden_tiered()
    assert any("session.queued after the session began" in v
               for v in check(trace[:3] + queued(1) + trace[3:], "tiered"))
