"""Agent watchdogs: a stalled response is ended through agent EOS with the watchdog's reason."""

from __future__ import annotations

import pytest

from vllm_omni_voicechat.audio.frames import OUTPUT_FRAME_BYTES, SILENT_OUTPUT_FRAME
from vllm_omni_voicechat.model.port import AgentControl, AgentOutput, BoundaryPhase, ResponseBoundary, StepResult
from vllm_omni_voicechat.session.commands import CommitTurn, StartTurn
from vllm_omni_voicechat.session.watchdog import AgentWatchdog
from vllm_omni_voicechat.sim.model import SimBehaviour

from .helpers import R, T, metrics, protocol, session

LOUD = bytes([0x00, 0x20] * (OUTPUT_FRAME_BYTES // 2))


def step(text: str = "", audio: bytes = SILENT_OUTPUT_FRAME) -> StepResult:
    control = AgentControl.TEXT if text else AgentControl.PAD
    return StepResult(audio=audio, agent=AgentOutput(control, None, text),
                      boundary=ResponseBoundary(BoundaryPhase.RESPONDING))


@pytest.mark.parametrize(
    ("positions", "reason", "at"),
    [
        ([step()] * 40, "decoded_silence_watchdog", 20),
        ([step(audio=LOUD)] * 40, "no_text_since_bos_watchdog", 30),
        ([step("a")] + [step(audio=LOUD)] * 40, None, None),
        ([step("a", LOUD)] + [step("b")] * 25, "decoded_silence_watchdog", 21),
    ],
    ids=["silent", "hum", "speaking", "falls-silent"],
)
def test_watchdog_trips_once_with_its_reason(positions, reason, at):
    w = AgentWatchdog()
    fired = [(i + 1, r) for i, p in enumerate(positions) if (r := w.observe(p))]
    assert fired == ([] if reason is None else [(at, reason)])


def test_no_audio_watchdog_when_text_flows_without_sound():
    w = AgentWatchdog(decoded_silence_frames=1000)
    fired = [r for i in range(31) if (r := w.observe(step("x")))]
    assert fired == ["no_audio_since_bos_watchdog"]


@pytest.mark.parametrize(("mode", "reason", "speaking"), [("silent", "decoded_silence_watchdog", 20),
                                                           ("hum", "no_text_since_bos_watchdog", 30)])
def test_a_stalled_response_ends_with_the_watchdog_reason(mode, reason, speaking):
    d = session(behaviour=SimBehaviour(stalled_response=mode, tail_positions=3), settlement_blank_frames=2)
    d.send(StartTurn(1, "s1"))
    d.send(CommitTurn(1, "c1"))
    d.run()
    assert protocol(d.events)[-1] == ("ResponseDone", T(1), R(1), "completed", reason)
    # BOS, the stalled positions, the EOS position and its 3-position tail
    assert len(metrics(d.events, "response_silence")) == speaking + 1 + 3
    assert not d.core.closed
