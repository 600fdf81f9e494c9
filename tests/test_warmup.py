"""Warmup: a throwaway session of silent positions runs before the server admits clients."""

from __future__ import annotations

import json
import urllib.request

import pytest

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
    report = warm_up(CountingModel(log), 3, clock=iter([10.0, 10.25]).__next__)
    assert log == ["prefill", "step:synthetic", "step:synthetic", "step:synthetic", "abort"]
    assert (report.positions, report.seconds) == (3, 0.25)


def test_a_failing_warmup_still_releases_the_model():
    log: list[str] = []
    with pytest.raises(RuntimeError, match="boom"):
        warm_up(CountingModel(log, fail_at=1), 3)
    assert log == ["prefill", "step:synthetic", "abort"]


def test_the_server_warms_up_before_it_is_ready():
    log: list[str] = []
    config = ServerConfig.simulator(warmup_positions=2)
    config.model_factory = lambda: CountingModel(log)
    with running_app(config) as (url, server):
        # on_ready fires after the startup hook: the warmup has run before any connection could be accepted
        assert log == ["prefill", "step:synthetic", "step:synthetic", "abort"]
        health = json.load(urllib.request.urlopen(url.replace("ws://", "http://") + "/health", timeout=10))
        assert health["warmup"]["positions"] == 2


def test_warmup_can_be_turned_off():
    log: list[str] = []
    config = ServerConfig.simulator(warmup_positions=0)
    config.model_factory = lambda: CountingModel(log)
    with running_app(config) as (_, server):
        assert log == [] and server.warmup is None

