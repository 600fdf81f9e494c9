"""Warmup: a throwaway session of silent positions runs before the server admits clients."""

from __future__ import annotations

import json
import urllib.request

from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.server.warmup import warm_up
from vllm_omni_voicechat.sim.model import SimulatorModel

from .server_fixture import running_app


class CountingModel(SimulatorModel):
    def __init__(self, log: list[str], fail_at: int | None = None):
        super().__init__()
        self.log = log
        self.fail_at = fail_at

    def prefill(self, prompt):
        self.log.append("prefill")
        super().prefill(prompt)

    def step(self, position):
        if len(self.log) - 1 == self.fail_at:
            raise RuntimeError("boom")
        self.log.append("step:synthetic" if position.synthetic else "step:real")
        return super().step(position)

    def abort(self):
        self.log.append("abort")
        super().abort()


def test_warm_up_prefills_steps_silent_positions_and_releases_the_model():
    log: list[str] = []
    ticks = iter([10.0, 10.0, 10.05, 10.05, 10.1, 10.1, 10.2, 10.25])  # start, (before, after) x 3, end
    report = warm_up(CountingModel(log), 3, clock=ticks.__next__)
    assert log == ["prefill", "step:synthetic", "step:synthetic", "step:synthetic", "abort"]
    assert (report.positions, report.seconds) == (3, 0.25) and report.step_ms == (50.0, 50.0, 100.0)


def test_a_failing_warmup_is_reported_and_still_releases_the_model():
    log: list[str] = []
    report = warm_up(CountingModel(log, fail_at=1), 3)
    assert log == ["prefill", "step:synthetic", "abort"]
    assert report.positions == 1 and report.error == "RuntimeError: boom" and len(report.step_ms) == 1
    assert report.to_json()["ok"] is False and report.to_json()["error"] == "RuntimeError: boom"


def test_warm_up_measures_each_position():
    log: list[str] = []
    ticks = iter([0.0, 1.0, 1.005, 2.0, 2.010, 3.0])
    report = warm_up(CountingModel(log), 2, clock=ticks.__next__)
    assert report.step_ms == (5.0, 10.0) and report.error is None
    assert len(report.inference_ms) == 2  # the simulator reports its own inference time per position


def test_a_failing_warmup_starts_the_server_degraded_not_dead():
    """A warm-up failure used to stop the server in its startup hook; now /health reports it and sessions are
    still admitted (the failure may have been transient)."""
    log: list[str] = []
    config = ServerConfig.simulator(warmup_positions=2)
    config.model_factory = lambda: CountingModel(log, fail_at=0 if not log else None)
    with running_app(config) as (url, server):
        health = json.load(urllib.request.urlopen(url.replace("ws://", "http://") + "/health", timeout=10))
        assert health["status"] == "degraded"
        assert health["warmup"] == {"positions": 0, "seconds": health["warmup"]["seconds"], "ok": False,
                                    "error": "RuntimeError: boom", "step_ms": [], "inference_ms": []}
        from .server_fixture import RawClient

        c = RawClient(url + "/v1/voicechat")
        assert c.recv()["type"] == "session.created"
        c.close()


def test_the_server_warms_up_before_it_is_ready():
    log: list[str] = []
    config = ServerConfig.simulator(warmup_positions=2)
    config.model_factory = lambda: CountingModel(log)
    with running_app(config) as (url, server):
        # on_ready fires after the startup hook: the warmup has run before any connection could be accepted
        assert log == ["prefill", "step:synthetic", "step:synthetic", "abort"]
        health = json.load(urllib.request.urlopen(url.replace("ws://", "http://") + "/health", timeout=10))
        assert health["warmup"]["positions"] == 2 and health["warmup"]["ok"] is True
        assert len(health["warmup"]["step_ms"]) == 2 and health["status"] == "ready"


def test_warmup_can_be_turned_off():
    log: list[str] = []
    config = ServerConfig.simulator(warmup_positions=0)
    config.model_factory = lambda: CountingModel(log)
    with running_app(config) as (_, server):
        assert log == [] and server.readiness.warmup is None

