"""The v3 receive pump over real WebSockets (contract §1, docs/v3-dialect.md "The receive pump"): every client
frame is handled in arrival order after the effects of the frames before it, a session.update's prefill included;
the pump is bounded (256 frames, beyond it ``input_backpressure``); a prefill that fails is fatal before
``session.updated``; close frames carry their reason."""

from __future__ import annotations

import base64
import json
import threading
import urllib.request

import pytest

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.sim.model import SimBehaviour
from vllm_omni_voicechat.wire.transport import MAX_CLOSE_REASON_BYTES, close_reason

from .server_fixture import RawClient, running_app

CLOCK_TOOL = {"name": "get_time", "description": "The time."}
UPDATE = {"type": "session.update", "event_id": "u1",
          "session": {"protocol_version": 3, "instructions": "Be brief.", "tools": [CLOCK_TOOL]}}
RESULT = {"type": "conversation.item.create", "event_id": "r1",
          "item": {"type": "function_call_output", "call_id": "call_unknown", "output": "noon"}}
TYPED = {"type": "input_text.request", "event_id": "t1", "job_id": "job-1", "text": "How are you"}
STOP = {"type": "session.stop", "event_id": "stop"}


def append(pcm: bytes, event_id: str) -> dict:
    return {"type": "input_audio_buffer.append", "event_id": event_id, "encoding": "pcm16", "sample_rate": 16000,
            "channels": 1, "audio": base64.b64encode(pcm).decode()}


def barrier(kind: str, k: int, event_id: str) -> dict:
    return {"type": f"input_audio_buffer.{kind}", "event_id": event_id, "client_turn_id": k}


def conversation() -> list[tuple[dict, str | None]]:
    """Every client message of the contract, each with the event type a waiting client waits for (None: none)."""
    speech = render_speech("hello there") + bytes(4 * INPUT_FRAME_BYTES)
    chunks = [speech[i:i + INPUT_FRAME_BYTES] for i in range(0, len(speech), INPUT_FRAME_BYTES)]
    return [
        (UPDATE, "session.updated"),
        (RESULT, "error"),  # no published call: "unknown or completed call_id"
        (barrier("turn_start", 1, "s1"), "input_audio_buffer.turn_started"),
        *[(append(chunk, f"a{i}"), None) for i, chunk in enumerate(chunks)],
        (barrier("commit", 1, "c1"), "input_audio_buffer.committed"),
        (TYPED, "input_text.accepted"),
        (STOP, "session.closed"),
    ]


STREAMED = {"voicechat.metrics", "response.output_audio.delta", "response.output_text.delta"}


def normalized(events: list[dict], session_id: str) -> list[tuple[str, str]]:
    """The non-streamed events as JSON without the envelope, the session id replaced (ids embed it)."""
    out = []
    for e in events:
        if e["type"] in STREAMED:
            continue
        body = {k: v for k, v in e.items() if k not in ("event_id", "session_id")}
        out.append((e["type"], json.dumps(body, sort_keys=True).replace(session_id, "S")))
    return out


def run(url: str, *, burst: bool) -> tuple[list[tuple[str, str]], int | None, str | None, RawClient]:
    c = RawClient(url + "/v1/realtime", timeout=20)
    created = c.recv()
    assert created["type"] == "session.created"
    session_id = created["session_id"]
    if burst:  # every frame goes out back to back, before any answer is read
        for message, _ in conversation():
            c.send(message)
    else:
        for message, answer in conversation():
            c.send(message)
            if answer is not None:
                got = c.recv_until(lambda e, a=answer: e["type"] in (a, "error") or e["type"] == "session.closed")
                assert got[-1]["type"] == answer, (message["type"], got[-1])
    code = c.close_code()
    return normalized(c.received, session_id), code, c.close_reason, c


BEHAVIOURS = {
    "default": SimBehaviour(),
    "slow_prefill": SimBehaviour(prefill_delay_s=2.0),
    "slow_step": SimBehaviour(step_delay_s=0.03),
}


@pytest.mark.parametrize("behaviour", list(BEHAVIOURS))
def test_a_burst_is_answered_as_when_each_message_waits_for_its_acknowledgement(behaviour):
    config = ServerConfig.simulator(settlement_blank_frames=3, max_sessions=2, behaviour=BEHAVIOURS[behaviour])
    with running_app(config) as (url, _):
        waited, waited_code, waited_reason, _ = run(url, burst=False)
        burst, burst_code, burst_reason, raw = run(url, burst=True)
    types = [t for t, _ in burst]
    # nothing is answered before the model-ready barrier (no session_not_configured, no early metrics)
    assert types[:2] == ["session.created", "session.updated"]
    first_metrics = next(i for i, e in enumerate(raw.received) if e["type"] == "voicechat.metrics")
    assert [e["type"] for e in raw.received].index("session.updated") < first_metrics
    assert "session_not_configured" not in json.dumps(burst)
    # every answer, and every event around them, exactly as the waiting client saw them, up to the typed
    # request's acceptance (after it, how far the typed job got before the stop depends on the client's timing)
    cut = types.index("input_text.accepted") + 1
    assert burst[:cut] == waited[:cut]
    assert [t for t, _ in burst[:cut]] == [
        "session.created", "session.updated", "error",
        "input_audio_buffer.speech_started", "input_audio_buffer.turn_started",
        "conversation.item.input_audio_transcription.delta", "conversation.item.input_audio_transcription.delta",
        "input_audio_buffer.committed", "input_audio_buffer.speech_stopped",
        "conversation.item.input_audio_transcription.completed", "response.created", "input_text.accepted",
    ]
    error = json.loads(burst[2][1])["error"]
    assert (error["code"], error["client_event_id"]) == ("invalid_function_call_output", "r1")
    assert error["message"] == "unknown or completed call_id"
    # both end with the stop's graceful close, its reason on the close frame
    for events in (burst, waited):
        assert events[-1] == ("session.closed", json.dumps({"reason": "client_stop", "status": "completed",
                                                            "type": "session.closed"}, sort_keys=True))
        assert not [e for t, e in events if t == "error" and json.loads(e)["error"]["fatal"]]
    assert (burst_code, burst_reason) == (waited_code, waited_reason) == (1000, "client_stop")


def test_the_pump_is_bounded_while_a_slow_prefill_holds_it():
    """256 frames wait behind the prefill (held ones included); the rest are refused with input_backpressure, each
    answered in its place, after session.updated."""
    config = ServerConfig.simulator(settlement_blank_frames=3, behaviour=SimBehaviour(prefill_delay_s=2.0))
    with running_app(config) as (url, _):
        c = RawClient(url + "/v1/realtime", timeout=20)
        assert c.recv()["type"] == "session.created"
        c.send(UPDATE)
        silence = bytes(INPUT_FRAME_BYTES)
        for i in range(300):
            c.send(append(silence, f"a{i}"))
        events = c.recv_until(lambda e: e["type"] == "error" and e["error"]["client_event_id"] == "a299")
        assert events[0]["type"] == "session.updated"
        errors = [e["error"] for e in events if e["type"] == "error"]
        assert [e["client_event_id"] for e in errors] == [f"a{i}" for i in range(256, 300)]
        assert {(e["code"], e["fatal"], e["limit"]) for e in errors} == {("input_backpressure", False, 256)}
        c.send(STOP)
        assert c.recv_type("session.closed")["reason"] == "client_stop"
        assert (c.close_code(), c.close_reason) == (1000, "client_stop")


def test_a_failed_prefill_is_fatal_before_session_updated_and_frees_the_slot():
    released = threading.Event()
    config = ServerConfig.simulator(settlement_blank_frames=3, max_sessions=1,
                                    behaviour=SimBehaviour(fail_prefill=True, prefill_delay_s=0.2))
    with running_app(config) as (url, server):
        server.admission.on_release = released.set
        c = RawClient(url + "/v1/realtime")
        assert c.recv()["type"] == "session.created"
        c.send(UPDATE)
        c.send(barrier("turn_start", 1, "s1"))  # queued behind the barrier: never answered, the session ends
        err = c.recv()
        assert err["type"] == "error"
        assert err["error"] == {"code": "internal_error", "message": err["error"]["message"], "fatal": True}
        assert "prefill" in err["error"]["message"]
        closed = c.recv()
        assert (closed["type"], closed["status"], closed["reason"]) == ("session.closed", "failed", "internal_error")
        assert (c.close_code(), c.close_reason) == (1011, "internal_error")
        assert [e["type"] for e in c.received] == ["session.created", "error", "session.closed"]
        assert released.wait(5)
        health = json.loads(urllib.request.urlopen(url.replace("ws://", "http://") + "/health", timeout=5).read())
        assert health["active_sessions"] == 0
        # the freed slot admits the next session (which fails the same way: every prefill fails)
        again = RawClient(url + "/v1/realtime")
        assert again.recv()["type"] == "session.created"
        again.close()


@pytest.mark.parametrize(("reason", "expected"), [
    ("client_stop", "client_stop"),
    ("x" * 200, "x" * MAX_CLOSE_REASON_BYTES),
    ("é" * 100, "é" * 61),  # 2-byte characters: 61 fit in 123 bytes, never half of one
    ("a" + "€" * 60, "a" + "€" * 40),  # 3-byte characters: 1 + 120 bytes
    ("bad\ud800", "bad?"),  # a lone surrogate cannot be sent
])
def test_close_reasons_are_at_most_123_utf8_bytes_cut_between_characters(reason: str, expected: str):
    assert close_reason(reason) == expected
    assert len(close_reason(reason).encode()) <= MAX_CLOSE_REASON_BYTES
