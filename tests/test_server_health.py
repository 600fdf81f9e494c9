"""``/health`` tells the truth about the model home (docs/reliability.md, "Engine-path faults"): ``ready``;
``degraded`` with a reason after a failed model cleanup or warm-up, and after a model step that timed out (a stalled
engine) until a later position completes; ``failed`` (503) when the host's engine probe says the engine is broken.
The simulator stands in for the engine; tests/test_engine_faults.py has the real one."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

from vllm_omni_voicechat.model.port import ModelError, ModelTimeout
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.sim.model import SimulatorModel

from .server_fixture import RawClient, running_app

FRAME = bytes(2 * 1280)


class FailingModel(SimulatorModel):
    """The simulator, raising ``failure[0]`` (when set) on every step."""

    def __init__(self, failure: list) -> None:
        super().__init__()
        self.failure = failure

    def step(self, position):
        if self.failure[0] is not None:
            raise self.failure[0]
        return super().step(position)


def health(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url.replace("ws://", "http://") + "/health", timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def one_position(url: str) -> RawClient:
    """A v3 session that has asked for one model position (its answer not yet read)."""
    c = RawClient(url + "/v1/voicechat")
    c.recv_type("session.created")
    c.send({"type": "session.update", "event_id": "u", "session": {"protocol_version": 3, "instructions": "Hi."}})
    c.recv_type("session.updated")
    c.send({"type": "input_audio_buffer.turn_start", "event_id": "t", "client_turn_id": 1})
    c.send({"type": "input_audio_buffer.append", "event_id": "a", "encoding": "pcm16", "sample_rate": 16000,
            "channels": 1, "audio": base64.b64encode(FRAME).decode()})
    return c


def fatal(c: RawClient) -> dict:
    error = c.recv_type("error")
    assert c.close_code() == 1011
    return error["error"]


def test_a_timed_out_step_degrades_health_until_a_position_completes():
    failure: list = [ModelTimeout("position 0: no Stage-2 audio within 10 s")]
    config = ServerConfig.simulator()
    config.model_factory = lambda: FailingModel(failure)
    with running_app(config) as (url, server):
        assert health(url)[1]["status"] == "ready"
        error = fatal(one_position(url))
        assert (error["code"], error["fatal"]) == ("internal_error", True)
        status, body = health(url)
        assert status == 200 and body["status"] == "degraded" and body["active_sessions"] == 0
        assert body["reason"] == ("a model step timed out (position 0: position 0: no Stage-2 audio within 10 s); "
                                  "no position has completed since")
        assert "engine" not in body  # no engine probe on the standalone server
        failure[0] = None  # the engine answers again
        c = one_position(url)
        c.recv_type("voicechat.metrics")
        assert health(url)[1]["status"] == "ready"  # a live session's completed position clears it
        c.send({"type": "session.stop", "event_id": "s"})
        assert c.close_code() == 1000
        assert "reason" not in health(url)[1]


def test_a_session_s_own_model_error_leaves_health_ready():
    failure: list = [ModelError("position 0: voicechat thinker: RuntimeError: boom")]
    config = ServerConfig.simulator()
    config.model_factory = lambda: FailingModel(failure)
    with running_app(config) as (url, _):
        assert fatal(one_position(url))["code"] == "internal_error"
        assert health(url)[1]["status"] == "ready"


def test_the_engine_probe_makes_health_failed_with_503():
    with running_app(ServerConfig.simulator()) as (url, server):
        broken: list = [None]

        async def probe():
            return broken[0]

        server.readiness.engine_probe = probe
        status, body = health(url)
        assert (status, body["status"], body["engine"]) == (200, "ready", "healthy")
        broken[0] = "vLLM-Omni's engine is not healthy: Stage-1 has no live replica"
        status, body = health(url)
        assert (status, body["status"], body["engine"]) == (503, "failed", "dead")
        assert body["reason"] == broken[0]


def test_readiness_order():
    from vllm_omni_voicechat.server.app import VoicechatServer

    server = VoicechatServer(ServerConfig.simulator())
    readiness = server.readiness
    assert readiness.status() == ("ready", None)
    readiness.model_stall = (1.0, "position 3: no Stage-0 output within 4 s")
    assert readiness.status()[0] == "degraded"
    readiness.cleanup_failure = "model abort failed: x"
    assert readiness.status() == ("degraded", "model abort failed: x")
    assert readiness.status("engine dead") == ("failed", "engine dead")
