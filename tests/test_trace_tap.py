"""The server-side trace tap: every socket the fixture server serves is seen by a TraceChecker, frame by frame,
for both dialects, and the fixture fails a test whose server broke an invariant."""

from __future__ import annotations

import json

import pytest

from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.trace import TraceChecker
from vllm_omni_voicechat.trace.recorder import TraceRecorder

from .server_fixture import RawClient, running_app


def test_tap_sees_every_frame_of_both_dialects():
    with running_app(ServerConfig.simulator(max_sessions=2)) as (url, server):
        recorder = server.config.trace_factory
        assert isinstance(recorder, TraceRecorder)
        v3 = RawClient(url + "/v1/voicechat")
        assert v3.recv()["type"] == "session.created"
        v3.send({"type": "session.update", "event_id": "u", "session": {"protocol_version": 3}})
        v3.recv_type("session.updated")
        v3.send("{nope")
        assert v3.recv_type("error")["error"]["code"] == "invalid_json"
        v3.send({"type": "session.stop", "event_id": "s"})
        v3.recv_type("session.closed")
        assert v3.close_code() == 1000
        tiered = RawClient(url + "/v1/duplex")
        tiered.send({"type": "session.update", "event_id": "u", "session": {}})
        assert tiered.recv()["type"] == "session.created"
        tiered.send({"type": "session.close", "event_id": "c"})
        tiered.recv_type("session.closed")
        assert tiered.close_code() == 1000
    a, b = recorder.traces
    assert (a.dialect, b.dialect) == ("v3", "tiered")
    assert a.client_count == 3 and a.server_count >= 4 and a.close_code == 1000
    assert b.client_count == 2 and b.server_count >= 3 and b.close_code == 1000
    assert a.violations == [] and b.violations == []


def test_recorder_fails_with_the_listing():
    recorder = TraceRecorder()
    checker = recorder("v3")
    checker.server_event(json.dumps({"type": "voicechat.metrics", "event_id": "e1", "session_id": "S"}))
    assert isinstance(checker, TraceChecker)
    with pytest.raises(AssertionError, match="first server event must be session.created"):
        recorder.check()
