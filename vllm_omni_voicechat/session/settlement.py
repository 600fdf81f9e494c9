"""Settlement: the zero-input positions between a commit and the explicit user EOU.

On commit only the positions still missing for the RNNT blank count to reach the fence run, at most
``2 x fence``. Without tools the fence position is also the agent-BOS position (fused); with tools the fence is
reached on PAD positions and a separate EOU position follows. Every settlement position is checked for response
and function activity; a violating position is never published.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..audio.frames import dbfs
from ..model.port import AgentControl, BoundaryPhase, PositionControls, StepResult

DEFAULT_FENCE = 10
SILENT_AUDIO_DBFS = -90.0


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: Literal["continue", "fence_reached", "fused_terminal", "fatal"]
    code: str = ""
    message: str = ""
    details: dict = field(default_factory=dict)
    publish: bool = False
    """For a fatal outcome: whether the position itself is clean and is published before the error."""


CONTINUE = Outcome("continue")


def activity_violation(result: StepResult) -> tuple[str, str] | None:
    """(code, message) when a position that must be quiescent shows function or response activity."""
    if result.function.busy or result.tool_call is not None:
        return "pre_eou_function_activity", "function-call state became active before the user EOU"
    if (
        result.boundary.phase is not BoundaryPhase.IDLE
        or result.boundary.started
        or result.agent.control is not AgentControl.PAD
        or result.agent.delta
        or dbfs(result.audio) > SILENT_AUDIO_DBFS
    ):
        return "pre_eou_response_activity", "the model produced response activity before the user EOU"
    return None


_PRE_EOU = PositionControls(pre_eou=True)


class Settlement:
    def __init__(self, *, fence: int, fused: bool, blank_count: int) -> None:
        if fence < 1:
            raise ValueError("fence must be >= 1")
        self.fence = fence
        self.fused = fused
        self.blank_count = blank_count
        self.steps = 0
        self.bound = 2 * fence

    @property
    def fence_met(self) -> bool:
        return self.blank_count >= self.fence

    def next_controls(self) -> PositionControls:
        """The next settlement position's controls: every one is pre-EOU (a client-owned settlement)."""
        if not self.fused:
            return _PRE_EOU
        if self.fence_met:
            return PositionControls(eou_now=True, pre_eou=True)
        if self.blank_count >= self.fence - 1:
            return PositionControls(eou_at_fence=self.fence, pre_eou=True)
        return _PRE_EOU

    def evidence(self) -> dict:
        return {
            "target_blank_frames": self.fence,
            "max_model_steps": self.bound,
            "model_steps": self.steps,
            "blank_count": self.blank_count,
            "mode": "fused" if self.fused else "separate",
        }

    def on_result(self, result: StepResult, controls: PositionControls) -> Outcome:
        self.steps += 1
        armed = controls.eou_now or controls.eou_at_fence is not None
        if armed and result.eou_consumed:
            self.blank_count = result.rnnt.blank_count
            failure = fused_contract_failure(result, self.fence)
            if failure:
                return Outcome("fatal", "fused_eou_contract_failure", failure, self.evidence())
            return Outcome("fused_terminal")
        violation = activity_violation(result)
        if violation:
            return Outcome("fatal", violation[0], violation[1], self.evidence())
        self.blank_count = result.rnnt.blank_count
        if not self.fused and self.fence_met:
            return Outcome("fence_reached")
        if self.steps >= self.bound:
            return Outcome(
                "fatal",
                "input_turn_settle_timeout",
                f"RNNT blank fence {self.fence} not reached within {self.bound} settlement positions",
                self.evidence(),
                publish=True,
            )
        return CONTINUE


def fused_contract_failure(result: StepResult, fence: int) -> str | None:
    """Why a fused fence/BOS position breaks its contract, or None."""
    if result.agent.control is not AgentControl.AGENT_BOS:
        return f"fence position produced {result.agent.control.value}, not agent_bos"
    if result.rnnt.blank_count < fence:
        return f"EOU fired at blank count {result.rnnt.blank_count} below the fence {fence}"
    if result.agent.delta:
        return "fence position changed the text channel"
    if result.function.busy:
        return "fence position has function-call activity"
    if dbfs(result.audio) > SILENT_AUDIO_DBFS:
        return "fence position audio is not silent"
    return None


def bos_contract_failure(result: StepResult) -> str | None:
    """Why a separate EOU position that produced agent BOS breaks its contract, or None."""
    if result.agent.delta:
        return "EOU position changed the text channel"
    return None
