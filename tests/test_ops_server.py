"""The operators' endpoints of the standalone server over real sockets: ``/v1/sessions`` while a session
runs, ``/v1/usage`` and ``/metrics`` after scripted sessions, with exact counts."""

from __future__ import annotations

import base64
import json
import urllib.request

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.ops.prometheus import VoicechatCollector
from vllm_omni_voicechat.server import ServerConfig

from .server_fixture import RawClient, running_app


def get(url: str, path: str) -> tuple[str, bytes]:
    with urllib.request.urlopen(url.replace("ws://", "http://") + path, timeout=10) as response:
        return response.headers["content-type"], response.read()


def spoken_turn(c: RawClient) -> list[dict]:
    assert c.recv()["type"] == "session.created"
    c.send({"type": "session.update", "event_id": "u", "session": {"protocol_version": 3, "instructions": "Hi."}})
    c.recv_type("session.updated")
    c.send({"type": "input_audio_buffer.turn_start", "event_id": "s", "client_turn_id": 1})
    c.send({"type": "input_audio_buffer.append", "event_id": "a", "encoding": "pcm16", "sample_rate": 16000,
            "channels": 1, "audio": base64.b64encode(render_speech("hello")).decode()})
    c.send({"type": "input_audio_buffer.commit", "event_id": "c", "client_turn_id": 1})
    return c.recv_until(lambda e: e["type"] == "response.done", skip_metrics=False)


def test_sessions_usage_and_metrics_after_scripted_sessions():
    with running_app(ServerConfig.simulator(max_sessions=1)) as (url, server):
        first = RawClient(url + "/v1/voicechat")
        events = spoken_turn(first)
        _, body = get(url, "/v1/sessions")
        status = json.loads(body)
        assert status["max_sessions"] == 1 and status["active"] == 1 and status["idle"] == 0
        (row,) = status["slots"]
        assert row["state"] == "active" and row["dialect"] == "v3" and row["positions"] >= len(
            [e for e in events if e["type"] == "voicechat.metrics" and e["frame"] is not None])
        assert set(row) == {"session_id", "dialect", "age_s", "positions", "state"}  # no content, no credentials

        busy = RawClient(url + "/v1/voicechat")  # every slot taken: the contract's immediate busy
        assert busy.close_code() == 1013
        tiered = RawClient(url + "/v1/duplex")
        tiered.send({"type": "session.update", "session": {}})  # the full lane is admitted at its first message
        assert tiered.close_code() == 1013

        first.send("{not json")
        first.recv_type("error")
        first.send({"type": "session.stop", "event_id": "x"})
        assert first.close_code() == 1000  # the session was folded into the book before its close

        _, body = get(url, "/v1/usage")
        usage = json.loads(body)
        assert usage["sessions"] == {"admitted": {"v3": 1}, "rejected": {"tiered": {"resource_exhausted": 1},
                                                                           "v3": {"busy": 1}},
                                     "ended": {"v3": {first.expected_close_reason(): 1}}, "live": 0}
        total = usage["total"]
        positions = [e for e in first.received if e["type"] == "voicechat.metrics" and e["frame"] is not None]
        assert total["sessions"] == 1 and total["positions"] == len(positions)
        assert total["responses"] == {"completed": 1} and total["errors"] == {"invalid_json": 1}
        assert total["commit_to_first_audio_seconds"]["count"] == 1
        (ended,) = usage["ended_sessions"]
        assert ended["dialect"] == "v3" and ended["positions"] == len(positions)

        content_type, body = get(url, "/metrics")
        assert content_type.startswith("text/plain; version=0.0.4")
        names = {f.name for f in text_string_to_metric_families(body.decode())}
        assert {"voicechat_sessions", "voicechat_model_positions", "voicechat_model_step_seconds",
                "voicechat_errors"} <= names

        registry = CollectorRegistry()  # this server alone (the process registry sums every server of the tests)
        registry.register(VoicechatCollector([server.views]))
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}
        assert samples[("voicechat_sessions_rejected_total", (("dialect", "v3"), ("reason", "busy")))] == 1
        assert samples[("voicechat_responses_total", (("dialect", "v3"), ("status", "completed")))] == 1
        assert samples[("voicechat_sessions", (("state", "active"),))] == 0


def test_sessions_status_shows_a_detached_session_with_its_grace_and_a_draining_one():
    """The rendering of /v1/sessions for the states a live socket test cannot pin in time: a tiered session in its
    resume grace and a session whose socket is still closing."""
    from types import SimpleNamespace

    from vllm_omni_voicechat.server.app import VoicechatServer
    from vllm_omni_voicechat.server.live import LiveSession

    server = VoicechatServer(ServerConfig.simulator(max_sessions=3, disconnect_grace_s=30.0))
    assert server.admission.try_acquire() is not None  # session A's slot
    protocol = SimpleNamespace(detached_at=100.0, journal=SimpleNamespace(retained_bytes=4096))
    attachment = SimpleNamespace(protocol=protocol, shell=SimpleNamespace(positions=7))
    server.live.add(LiveSession("A", "tiered", attachment, 90.0))  # type: ignore[arg-type]
    server.usage.admit("A", "tiered", 90.0)
    server.live.add(LiveSession("B", "v3", SimpleNamespace(), 100.0, draining_since=104.0))  # type: ignore[arg-type]
    assert server.views.sessions_status(110.0) == {
        "max_sessions": 3, "active": 0, "detached": 1, "idle": 2,
        "slots": [{"session_id": "A", "dialect": "tiered", "age_s": 20.0, "positions": 7, "state": "detached",
                   "grace_left_s": 20.0}, {"state": "idle"}, {"state": "idle"}],
        "draining": [{"session_id": "B", "dialect": "v3", "draining_s": 6.0}],
        "queued": 0, "queue_capacity": 0,
    }
    assert server.views.operator_gauges() == {"active": 0, "detached": 1, "queued": 0, "journal_bytes": 4096}


def test_session_logs_say_who_came_what_it_did_and_every_error_it_sent_without_content(caplog):
    """At info: a line when a session starts (id, dialect, lane, client, user agent) and when it ends (duration,
    positions, responses, function calls, errors by code, end reason); a warning for every error event sent."""
    import logging

    caplog.set_level(logging.INFO, logger="vllm_omni_voicechat.server")
    with running_app(ServerConfig.simulator(max_sessions=1)) as (url, server):
        c = RawClient(url + "/v1/voicechat")
        spoken_turn(c)
        session_id = next(iter(server.live))
        c.send("{not json")
        c.recv_type("error")
        c.send({"type": "session.stop", "event_id": "x"})
        assert c.close_code() == 1000
    lines = [r.getMessage() for r in caplog.records if session_id in r.getMessage()]
    started = [line for line in lines if " started: " in line]
    assert len(started) == 1 and "v3, lane v3, client 127.0.0.1:" in started[0] and "user agent 'Python" in started[0]
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and session_id in r.getMessage()]
    assert [r.getMessage() for r in warned] == [f"session {session_id} sent error invalid_json"]
    ended = [line for line in lines if " ended: " in line]
    assert len(ended) == 1
    assert "v3 after " in ended[0] and "responses {'completed': 1}" in ended[0]
    assert "errors {'invalid_json': 1}" in ended[0] and "reason client_stop" in ended[0]
    assert not [line for line in lines if "hello" in line.lower() or "You said" in line]  # no content


def test_a_client_s_close_reason_is_echoed_but_counted_as_client_close(caplog):
    """A client's words never become a label: a session.close reason is echoed on session.closed and the close
    frame, while /v1/usage, /metrics and the session's log line say client_close."""
    import logging

    caplog.set_level(logging.INFO, logger="vllm_omni_voicechat.server")
    words = 'my "own"\nreason 7f3a'
    with running_app(ServerConfig.simulator(max_sessions=2)) as (url, server):
        c = RawClient(url + "/v1/duplex")
        c.send({"type": "session.update", "session": {}})
        c.recv_type("session.created")
        c.send({"type": "session.close", "reason": words})
        assert c.recv_type("session.closed")["reason"] == words
        assert c.close_code() == 1000
        _, body = get(url, "/v1/usage")
        usage = json.loads(body)
        assert usage["sessions"]["ended"] == {"tiered": {"client_close": 1}}
        assert [s["ended_reason"] for s in usage["ended_sessions"]] == ["client_close"]
        _, metrics = get(url, "/metrics")
        assert b"7f3a" not in metrics and b'reason="client_close"' in metrics
    assert not [r for r in caplog.records if "7f3a" in r.getMessage()]


def _series(body: bytes) -> set[str]:
    """The series of a Prometheus text exposition: each sample's name and labels, without its value."""
    return {line.rsplit(" ", 1)[0] for line in body.decode().splitlines() if line and not line.startswith("#")}


def _key_paths(value: object, prefix: str = "") -> set[str]:
    """Every key path of nested JSON objects (lists are left out: their length is their own bound)."""
    if not isinstance(value, dict):
        return set()
    return {p for k, v in value.items() for p in ({f"{prefix}/{k}"} | _key_paths(v, f"{prefix}/{k}"))}


def _hostile_round(url: str, k: int) -> None:
    """Sessions of both dialects full of strings no server chose: event ids, event types, a model name, a close
    reason, all unique to round ``k``."""
    t = RawClient(url + f"/v1/duplex?model=model-{k}-\"x\"")
    t.send({"type": "session.update", "event_id": f"u-{k}", "session": {}})
    t.recv_type("session.created")
    t.send({"type": f"bogus.{k}", "event_id": f"e-{k}"})
    t.recv_type("error")
    t.send({"type": "session.close", "reason": f"reason {k}\n\"quoted\""})
    t.recv_type("session.closed")
    assert t.close_code() == 1000
    v = RawClient(url + "/v1/voicechat")
    v.recv_type("session.created")
    v.send({"type": f"bogus.{k}", "event_id": f"e-{k}"})
    v.recv_type("error")
    v.send({"type": "session.stop", "event_id": f"stop-{k}"})
    assert v.close_code() == 1000


def test_metrics_series_do_not_grow_with_what_clients_send():
    """Label values come only from the server's own vocabularies: rounds of sessions with unique client strings
    leave the set of /metrics series, and /v1/usage's counter keys, as they were after the first rounds."""
    import gc

    gc.collect()  # /metrics sums this process's live servers: earlier tests' ended servers must not vanish midway
    with running_app(ServerConfig.simulator(max_sessions=2)) as (url, _):
        for k in range(2):
            _hostile_round(url, k)
        _, metrics = get(url, "/metrics")
        _, usage = get(url, "/v1/usage")
        before, before_usage = _series(metrics), json.loads(usage)["sessions"]
        for k in range(2, 6):
            _hostile_round(url, k)
        _, metrics = get(url, "/metrics")
        _, usage = get(url, "/v1/usage")
        after, after_usage = _series(metrics), json.loads(usage)["sessions"]
    assert after == before
    assert _key_paths(after_usage) == _key_paths(before_usage)
    assert "bogus" not in metrics.decode() and "reason 5" not in metrics.decode()
