"""The v3 server over real WebSockets with a raw JSON client: handshake, exact turn order, barge-in, typed
input, stop, admission, disconnect cleanup, concurrency and the Pipecat client's minimal exchange."""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import urllib.request

import pytest

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.model.port import SessionPrompt
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.sim.model import SimulatorModel

from .server_fixture import RawClient, running_app, running_server

UPDATE = {"type": "session.update", "event_id": "u1", "session": {"protocol_version": 3, "instructions": "Be brief."}}


def append(pcm: bytes, event_id: str = "a") -> dict:
    return {
        "type": "input_audio_buffer.append",
        "event_id": event_id,
        "encoding": "pcm16",
        "sample_rate": 16000,
        "channels": 1,
        "audio": base64.b64encode(pcm).decode(),
    }


def barrier(kind: str, k: int, event_id: str) -> dict:
    return {"type": f"input_audio_buffer.{kind}", "event_id": event_id, "client_turn_id": k}


def configured(url: str, update: dict = UPDATE) -> RawClient:
    c = RawClient(url + "/v1/realtime")
    assert c.recv()["type"] == "session.created"
    c.send(update)
    assert c.recv_type("session.updated")
    return c


@pytest.fixture(scope="module")
def url():
    with running_server(ServerConfig.simulator(settlement_blank_frames=3, max_sessions=8)) as base:
        yield base


def strip(events: list[dict]) -> list[tuple]:
    """(type, key fields) without envelope and audio deltas."""
    out = []
    for e in events:
        if e["type"] == "response.output_audio.delta":
            continue
        body = {k: v for k, v in e.items() if k not in ("type", "event_id", "session_id")}
        out.append((e["type"], body))
    return out


def test_happy_microphone_turn_exact_order_and_envelope(url):
    c = configured(url)
    sid = c.received[0]["session_id"]
    c.send(barrier("turn_start", 1, "s1"))
    c.send(append(render_speech("Hi there")))
    c.send(barrier("commit", 1, "c1"))
    events = c.recv_until(lambda e: e["type"] == "response.done")
    T, R = f"turn_{sid}_1", f"response_{sid}_1"
    assert strip(events) == [
        ("input_audio_buffer.speech_started", {"turn_id": T, "source": "microphone", "job_id": None, "correlation": 1}),
        ("input_audio_buffer.turn_started", {"client_event_id": "s1", "client_turn_id": 1, "turn_id": T}),
        ("conversation.item.input_audio_transcription.delta",
         {"turn_id": T, "delta": "Hi", "transcript": "Hi", "source": "microphone", "job_id": None}),
        ("conversation.item.input_audio_transcription.delta",
         {"turn_id": T, "delta": " there", "transcript": "Hi there", "source": "microphone", "job_id": None}),
        ("input_audio_buffer.committed", {"client_event_id": "c1", "client_turn_id": 1, "turn_id": T}),
        ("input_audio_buffer.speech_stopped", {"turn_id": T, "source": "microphone", "job_id": None}),
        ("conversation.item.input_audio_transcription.completed",
         {"turn_id": T, "transcript": "Hi there", "empty": False, "source": "microphone", "job_id": None}),
        ("response.created", {"turn_id": T, "response_id": R}),
        *[("response.output_text.delta", {"turn_id": T, "response_id": R, "delta": d, "text": t})
          for d, t in [("You", "You"), (" sai", "You sai"), ("d:", "You said:"), (" Hi", "You said: Hi"),
                       (" the", "You said: Hi the"), ("re.", "You said: Hi there.")]],
        ("response.output_text.done", {"turn_id": T, "response_id": R, "text": "You said: Hi there.", "empty": False}),
        ("response.output_audio.done", {"turn_id": T, "response_id": R, "empty": False}),
        ("response.done", {"turn_id": T, "response_id": R, "status": "completed", "reason": "post_eos_audio_silence"}),
    ]
    audio_events = [e for e in events if e["type"] == "response.output_audio.delta"]
    assert all((e["encoding"], e["sample_rate"], e["channels"]) == ("pcm16", 22050, 1) for e in audio_events)
    pcm = b"".join(base64.b64decode(e["delta"], validate=True) for e in audio_events)
    assert decode_speech(pcm, 22050) == "You said: Hi there."
    ids = [e["event_id"] for e in c.received]
    assert len(ids) == len(set(ids)) and all(e["session_id"] == sid for e in c.received)
    assert ids[0] == f"evt_{sid}_1"
    c.close()


def test_metrics_flow_per_position_and_none_before_session_updated(url):
    c = RawClient(url + "/v1/realtime")
    c.recv()
    c.send(UPDATE)
    first = c.recv()
    assert first["type"] == "session.updated"  # no voicechat.metrics before the model-ready barrier
    c.send(barrier("turn_start", 1, "s1"))
    c.send(append(bytes(INPUT_FRAME_BYTES * 3)))
    c.send(barrier("commit", 1, "c1"))
    events = c.recv_until(lambda e: e["type"] == "response.created", skip_metrics=False)
    metrics = [e for e in events if e["type"] == "voicechat.metrics"]
    assert [m["frame"] for m in metrics] == list(range(len(metrics)))
    m = metrics[0]
    assert set(m) >= {"frame", "transport_frame", "inference_ms", "server_step_ms", "budget_ms", "over_budget",
                      "input_audio", "output_audio", "model_output_audio", "audio_delivered", "turn_state",
                      "turn_id", "response_id", "step9_capture_fallback"}
    assert m["budget_ms"] == 80 and m["transport_frame"] == 0
    c.close()


def test_barge_in_cancels_the_open_response_before_the_new_turn(url):
    c = configured(url)
    c.send(barrier("turn_start", 1, "s1"))
    c.send(append(render_speech("Please tell me a very long story")))
    c.send(barrier("commit", 1, "c1"))
    created = c.recv_type("response.created")
    c.recv_type("response.output_text.delta")  # the assistant is speaking
    c.send(barrier("turn_start", 2, "s2"))
    events = c.recv_until(lambda e: e["type"] == "input_audio_buffer.turn_started")
    tail = [e["type"] for e in events if e["type"] != "response.output_text.delta"]
    assert tail[-5:] == [
        "response.output_text.done",
        "response.output_audio.done",
        "response.done",
        "input_audio_buffer.speech_started",
        "input_audio_buffer.turn_started",
    ]
    done = next(e for e in events if e["type"] == "response.done")
    assert (done["response_id"], done["turn_id"], done["status"], done["reason"]) == (
        created["response_id"], created["turn_id"], "cancelled", "client_vad")
    c.send(barrier("commit", 2, "c2"))
    second = c.recv_type("response.created")
    assert second["response_id"] != created["response_id"]
    c.close()


def test_typed_input_end_to_end(url):
    c = configured(url)
    c.send({"type": "input_text.request", "event_id": "t1", "job_id": "job-1", "text": "What time is it?"})
    events = c.recv_until(lambda e: e["type"] == "response.done")
    types = [e["type"] for e in events if e["type"] not in ("response.output_audio.delta", "response.output_text.delta")]
    assert types[:3] == ["input_text.accepted", "input_text.injection_started", "input_audio_buffer.speech_started"]
    assert types.count("input_text.injection_started") == 1
    assert "input_text.injection_finished" in types
    assert "input_audio_buffer.turn_started" not in types and "input_audio_buffer.committed" not in types
    speech = [e for e in events if e["type"].startswith(("input_audio_buffer.speech", "conversation.item.input"))]
    assert all(e["source"] == "typed" and e["job_id"] == "job-1" for e in speech)
    completed = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert completed["transcript"] == "What time is it?"
    done_text = next(e for e in events if e["type"] == "response.output_text.done")
    assert done_text["text"] == "You said: What time is it?"
    finished = next(e for e in events if e["type"] == "input_text.injection_finished")
    assert finished["disposition"] == "completed"
    c.close()


def test_stop_closes_with_session_closed_and_1000(url):
    c = configured(url)
    c.send(barrier("turn_start", 1, "s1"))
    c.send(append(render_speech("Bye")))
    c.send({"type": "session.stop", "event_id": "stop"})
    events = c.recv_until(lambda e: e["type"] == "session.closed")
    assert events[-3:][0]["type"] == "input_audio_buffer.speech_stopped"
    assert events[-1]["status"] == "completed" and events[-1]["reason"] == "client_stop"
    assert c.close_code() == 1000
    assert c.close_reason == "client_stop"  # a graceful close carries its session.closed reason


def test_health_reports_sessions_protocol_and_typed_readiness(url):
    body = json.loads(urllib.request.urlopen(url.replace("ws://", "http://") + "/health", timeout=10).read())
    assert body["status"] == "ready" and body["model_kind"] == "simulator"
    assert body["protocol"] == {"name": "voicechat.realtime", "version": 3}
    assert body["max_sessions"] == 8 and isinstance(body["active_sessions"], int)
    assert body["typed_input"] == {"ready": True, "synthesizer": "simulator"}
    assert body["auth_required"] is False


def test_busy_at_capacity_while_the_admitted_session_keeps_working_and_disconnect_frees_the_slot():
    released = threading.Event()
    with running_app(ServerConfig.simulator(settlement_blank_frames=2, max_sessions=1)) as (base, server):
        server.admission.on_release = released.set
        first = configured(base)
        busy = RawClient(base + "/v1/realtime")
        event = busy.recv()
        assert event["type"] == "error"
        assert event["error"] == {"code": "server_busy", "message": event["error"]["message"], "fatal": True}
        assert busy.close_code() == 1013
        assert busy.close_reason == "server_busy"
        # the admitted session is unaffected
        first.send(barrier("turn_start", 1, "s1"))
        first.send(barrier("commit", 1, "c1"))
        assert first.recv_type("response.done")["status"] == "completed"
        # an abrupt disconnect mid-turn tears the session down and frees its slot
        first.send(barrier("turn_start", 2, "s2"))
        first.send(append(render_speech("going away now")))
        first.ws.socket.close()  # no closing handshake
        assert released.wait(10)
        assert server.admission.active == 0 and not server.live
        again = configured(base)  # admitted at once
        again.close()


def test_model_ready_barrier_waits_for_the_prefill():
    gate = threading.Event()

    class SlowPrefill(SimulatorModel):
        def prefill(self, prompt: SessionPrompt) -> None:
            gate.wait(10)
            super().prefill(prompt)

    config = ServerConfig.simulator(settlement_blank_frames=2)
    config.model_factory = SlowPrefill
    with running_server(config) as base:
        c = RawClient(base + "/v1/realtime", timeout=0.3)
        c.recv()
        c.send(UPDATE)
        with pytest.raises(TimeoutError):
            c.recv()  # nothing, not even metrics, before the prefill completes
        gate.set()
        c.timeout = 10
        assert c.recv()["type"] == "session.updated"
        c.close()


@pytest.fixture
def fresh_url():
    """A server of its own: the shared one may still be releasing an earlier test's slots (server_busy)."""
    with running_server(ServerConfig.simulator(settlement_blank_frames=3, max_sessions=8)) as base:
        yield base


@pytest.mark.parametrize("sessions", [2, 8])
def test_concurrent_sessions_streaming_paced_audio_do_not_interfere(fresh_url, sessions):
    url = fresh_url
    phrases = [f"session number {i} says {w}" for i, w in enumerate(["red", "green", "blue", "cyan", "gold", "pink",
                                                                    "gray", "teal"][:sessions])]
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def talk(i: int) -> None:
        try:
            c = configured(url)
            c.send(barrier("turn_start", 1, f"s{i}"))
            pcm = render_speech(phrases[i])
            start = time.monotonic()
            for k in range(0, len(pcm), INPUT_FRAME_BYTES):
                c.send(append(pcm[k : k + INPUT_FRAME_BYTES], f"a{k}"))
                # real-time pacing of the client's microphone, on an absolute schedule
                time.sleep(max(0.0, start + (k // INPUT_FRAME_BYTES + 1) * 0.08 - time.monotonic()))  # ok
            c.send(barrier("commit", 1, f"c{i}"))
            events = c.recv_until(lambda e: e["type"] == "response.done")
            results[i] = next(e["text"] for e in events if e["type"] == "response.output_text.done")
            c.close()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=talk, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert results == {i: f"You said: {p}." for i, p in enumerate(phrases)}


def test_live_sessions_share_a_few_model_threads_not_one_each(fresh_url):
    """Eight configured simulator sessions (steps on the loop) prefill in the server's shared pool: at most
    MODEL_POOL_THREADS model threads exist, not one per session."""
    from vllm_omni_voicechat.server.hosting import MODEL_POOL_THREADS

    def model_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("voicechat-model")}

    before = model_threads()  # other servers' in this process
    clients = [configured(fresh_url) for _ in range(8)]  # each one's prefill has returned (session.updated)
    assert 1 <= len(model_threads() - before) <= MODEL_POOL_THREADS < 8
    for c in clients:
        c.send({"type": "session.stop", "event_id": "x"})
        assert c.close_code() == 1000


def test_pipecat_minimal_exchange_fields_the_client_validates(url):
    c = RawClient(url + "/v1/realtime")
    created = c.recv()
    assert created["type"] == "session.created"
    assert created["protocol"] == {"name": "voicechat.realtime", "version": 3}
    caps = created["capabilities"]
    assert caps["input_turn_detection"] == "client_smart_turn_v1" and caps["server_turn_detection"] is None
    assert caps["function_output_model_output"] == {"mode": "client_authored_v1"}
    assert caps["binary_audio"] is False and caps["max_session_model_frames"] == 12000
    assert isinstance(created["session"]["id"], str) and created["session"]["id"] == created["session_id"]
    assert created["session"]["output_audio_sample_rate"] == 22050 and created["session"]["frame_duration_ms"] == 80
    c.send({"type": "session.update", "event_id": "client_evt_" + "0" * 32,
            "session": {"protocol_version": 3, "instructions": "Keep answers short.", "tools": [],
                        "capabilities": {"function_output_model_output": "client_authored_v1"}}})
    updated = c.recv()
    assert updated["type"] == "session.updated"
    assert updated["session"]["protocol_version"] == 3
    assert updated["session"]["capabilities"] == {"function_output_model_output": "client_authored_v1"}
    start_id, commit_id = "client_evt_" + "1" * 32, "client_evt_" + "2" * 32
    c.send(barrier("turn_start", 1, start_id))
    c.send(append(render_speech("Hello")))
    c.send(barrier("commit", 1, commit_id))
    events = c.recv_until(lambda e: e["type"] == "response.done")
    by_type = {}
    for e in events:
        by_type.setdefault(e["type"], []).append(e)
    ack = by_type["input_audio_buffer.turn_started"][0]
    assert (ack["client_turn_id"], ack["client_event_id"]) == (1, start_id)
    committed = by_type["input_audio_buffer.committed"][0]
    assert (committed["client_turn_id"], committed["client_event_id"]) == (1, commit_id)
    assert isinstance(committed["turn_id"], str) and committed["turn_id"]
    response = by_type["response.created"][0]
    assert response["turn_id"] == committed["turn_id"] and isinstance(response["response_id"], str)
    assert events.index(committed) < events.index(response)
    for e in by_type["response.output_text.delta"] + by_type["response.output_audio.delta"]:
        assert e["response_id"] == response["response_id"]
    assert len(by_type["response.output_audio.delta"]) >= 1
    for e in by_type["response.output_audio.delta"]:
        assert (e["encoding"], e["sample_rate"], e["channels"]) == ("pcm16", 22050, 1)
        base64.b64decode(e["delta"], validate=True)
    for e in by_type["input_audio_buffer.speech_started"] + by_type["conversation.item.input_audio_transcription.delta"]:
        assert e["source"] == "microphone"
    assert by_type["conversation.item.input_audio_transcription.completed"][0]["transcript"] == "Hello"
    assert by_type["response.done"][0]["status"] == "completed"
    c.send({"type": "session.stop", "event_id": "client_evt_" + "3" * 32})
    closed = c.recv_type("session.closed")
    assert closed["status"] == "completed"
    assert c.close_code() == 1000
    assert all(re.fullmatch(r"evt_.+_\d+", e["event_id"]) for e in c.received)


@pytest.mark.parametrize("path", ["asgi", "direct"])
def test_a_failing_socket_reader_ends_the_session_and_frees_its_slot(monkeypatch, path):
    """A transport error while reading is a disconnect: the session is torn down, never left hanging. Both read
    paths: ASGI receive (under another server) and frames straight from our protocol (server/reader.py)."""
    from starlette.websockets import WebSocket

    from vllm_omni_voicechat.server import reader
    from vllm_omni_voicechat.shell.aio import SessionShell

    if path == "asgi":
        real_receive = WebSocket.receive

        async def receive(self):
            message = await real_receive(self)
            if "transport-breaks-here" in (message.get("text") or ""):
                raise RuntimeError("the transport broke")
            return message

        monkeypatch.setattr(reader, "protocol_for", lambda websocket: None)
        monkeypatch.setattr(WebSocket, "receive", receive)
    else:
        real_offer = SessionShell.offer_nowait

        def offer_nowait(self, message):
            if "transport-breaks-here" in message:
                raise RuntimeError("the transport broke")
            return real_offer(self, message)

        monkeypatch.setattr(SessionShell, "offer_nowait", offer_nowait)
    released = threading.Event()
    with running_app(ServerConfig.simulator(settlement_blank_frames=2, max_sessions=1)) as (base, server):
        server.admission.on_release = released.set
        c = configured(base)
        c.send({"type": "transport-breaks-here"})
        assert released.wait(10)
        assert server.admission.active == 0 and not server.live
        configured(base).close()  # the slot is free again
