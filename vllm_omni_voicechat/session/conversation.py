"""What the client sees of the model's positions: the open input turn and response, their brackets, transcript
and output deltas, the agent watchdogs and the per-position metrics (the liveness signal). It emits through the
core's output list and is handed the core only to publish a position (a call the model makes is the core's business)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..model.port import AgentControl, BoundaryPhase, StepResult
from ..runner.stage0 import PositionKind, StepMetrics
from .events import (
    AudioDelta,
    AudioDone,
    PositionMetrics,
    ResponseCreated,
    ResponseDone,
    ResponseStatus,
    Source,
    SpeechStarted,
    SpeechStopped,
    TextDelta,
    TextDone,
    TranscriptCompleted,
    TranscriptDelta,
    Output,
    TurnCommitted,
)
from .gate import MicFrame
from .lifecycle import InputTurn, TurnLifecycle, TurnMove
from .watchdog import AgentWatchdog

if TYPE_CHECKING:
    from .core import SessionCore
    from .functions import FunctionCycles
    from .turns import TurnLedger


@dataclass(slots=True)
class Response:
    turn_id: str
    response_id: str
    text: str = ""
    audio_sent: bool = False


class Conversation:
    def __init__(self, emit: Callable[[Output], None], session_id: str, turns: TurnLedger,
                 functions: FunctionCycles) -> None:
        self._emit = emit
        self._session_id = session_id
        self._turns = turns
        self._functions = functions
        self._turn_seq = 0
        self._response_seq = 0
        self.lifecycle = TurnLifecycle()
        """The input turn: open, held, and its state (``lifecycle.py``)."""
        self.pending_transcript = ""
        """RNNT words heard while no turn was open (a turn opened next starts with them)."""
        self.response: Response | None = None
        self.eou_turn_id: str | None = None
        """The last user turn that ended with an EOU (a call the model makes without a response belongs to it)."""
        self.blank_count = 0
        self.model_busy = False
        """The function channel is busy or owes a post-call BOS: work the client has not seen yet."""
        self.step_metrics: StepMetrics | None = None
        """The runner's measurement of the position being published."""
        self._watchdog = AgentWatchdog()
        self._eos_reason: str | None = None

    # ================================================================ brackets

    @property
    def input_turn(self) -> InputTurn | None:
        return self.lifecycle.turn

    def new_turn_id(self) -> str:
        self._turn_seq += 1
        return f"turn_{self._session_id}_{self._turn_seq}"

    def open_input_turn(self, turn_id: str, source: Source, job_id: str | None, correlation: int | str) -> InputTurn:
        turn = InputTurn(turn_id, source, job_id, self.pending_transcript)
        self.pending_transcript = ""
        self.lifecycle.open(turn)
        self._emit(SpeechStarted(turn_id, source, job_id, correlation))
        return turn

    def close_input_turn(self, move: TurnMove = TurnMove.CLOSE) -> str | None:
        """The open turn's speech stopped and transcript completed (any move that ends it but ``CLEAR``); its id."""
        turn = self.lifecycle.close(move)
        if turn is None:
            return None
        emit = self._emit
        emit(SpeechStopped(turn.turn_id, turn.source, turn.job_id))
        emit(TranscriptCompleted(turn.turn_id, turn.transcript, turn.source, turn.job_id))
        return turn.turn_id

    def open_response(self, turn_id: str) -> Response:
        self._watchdog.reset()
        self._eos_reason = None
        self._response_seq += 1
        self.response = Response(turn_id, f"response_{self._session_id}_{self._response_seq}")
        self._emit(ResponseCreated(turn_id, self.response.response_id))
        return self.response

    def close_response(self, status: ResponseStatus, reason: str) -> None:
        response, self.response = self.response, None
        if response is None:
            return
        emit = self._emit
        emit(TextDone(response.turn_id, response.response_id, response.text))
        emit(AudioDone(response.turn_id, response.response_id, not response.audio_sent))
        emit(ResponseDone(response.turn_id, response.response_id, status, reason))

    def clear_input_turn(self) -> InputTurn | None:
        """The client dropped the open turn (``CLEAR``): no transcript completes."""
        return self.lifecycle.close(TurnMove.CLEAR)

    def close_brackets(self, response_status: ResponseStatus, reason: str) -> None:
        self.close_input_turn(TurnMove.ABANDON)
        self.close_response(response_status, reason)

    # ================================================================ publication

    def publish(
        self,
        core: SessionCore,
        result: StepResult,
        *,
        ack: TurnCommitted | None = None,
        close_turn: bool = False,
        suppress: bool = False,
        eou_turn_id: str | None = None,
    ) -> None:
        """Publish one position's events in contract order; then its metrics."""
        emit = self._emit
        self.blank_count = result.rnnt.blank_count
        self.model_busy = result.function.busy or result.function.post_fc_bos_pending
        if ack is not None:
            emit(ack)
        delta = result.rnnt.text_delta
        if delta:
            turn = self.lifecycle.turn
            if turn is None:
                self.pending_transcript += delta  # RNNT evidence never opens a turn
            else:
                turn.transcript += delta
                emit(TranscriptDelta(turn.turn_id, delta, turn.transcript, turn.source, turn.job_id))
        if close_turn:
            eou_turn_id = self.close_input_turn()
        agent = result.agent
        if agent.control is AgentControl.AGENT_BOS and self.response is None and not suppress:
            self.open_response(eou_turn_id or self.new_turn_id())
        if result.tool_call is not None:
            self._functions.on_tool_call(core, result, suppress)
        response = self.response
        if response is not None and not suppress:
            if agent.delta:
                response.text += agent.delta
                emit(TextDelta(response.turn_id, response.response_id, agent.delta, response.text))
            if result.audio:
                response.audio_sent = True
                emit(AudioDelta(response.turn_id, response.response_id, result.audio))
            if result.boundary.ended:
                self.close_response("completed", self._eos_reason or result.boundary.reason or "model_or_turn_taking")
            elif self.model_busy or self._functions.cycle is not None:
                self._watchdog.reset()  # function work is not a stall; speech after it is a new stretch
            elif result.boundary.phase is BoundaryPhase.RESPONDING and not result.boundary.started:
                reason = self._watchdog.observe(result)
                if reason is not None:
                    core.eos_next()
                    self._eos_reason = reason
        self._emit_metrics(result, delivered=response is not None and not suppress)

    def _emit_metrics(self, result: StepResult, delivered: bool) -> None:
        m = self.step_metrics
        assert m is not None
        response = self.response
        cycle = self._functions.cycle
        turn_state = {
            "open_client_turn_id": self._turns.open_client_turn_id,
            "blank_count": result.rnnt.blank_count,
            "agent_control": result.agent.control._value_,  # the member's value without the property's two calls
            "boundary": result.boundary.phase._value_,
            "late_ms": round(m.late_ms * 1000.0) / 1000.0,  # round(x, 3) formats the float: ~2.5x dearer
            "function_cycle": cycle.call_id if cycle else None,
            "model": result.telemetry,
        }
        if m.kind is PositionKind.SETTLEMENT:
            turn_state["settlement_input_source"] = "queued_microphone_audio" if m.input_audio else "zero"
        self._emit(
            PositionMetrics(  # positionally, in field order: every position (a keyword costs ~35 ns on 3.11)
                m.frame,
                m.transport_frame,
                m.kind._value_,
                round(m.inference_ms * 1000.0) / 1000.0,
                round(m.server_step_ms * 1000.0) / 1000.0,
                m.budget_ms,
                m.over_budget,
                m.input_audio,
                bool(result.audio),  # output_audio
                delivered and bool(result.audio),  # audio_delivered
                turn.turn_id if (turn := self.lifecycle.turn) else (response.turn_id if response else None),
                response.response_id if response else None,
                turn_state,
            )
        )

    def emit_gated_metrics(self, frame: MicFrame, preroll_frames: int) -> None:
        """Metrics for a microphone frame the closed input gate held (no position ran)."""
        self._emit(
            PositionMetrics(
                frame=None,
                transport_frame=frame.transport_frame,
                kind="gated",
                inference_ms=0.0,
                server_step_ms=0.0,
                budget_ms=80.0,
                over_budget=False,
                input_audio=True,
                output_audio=False,
                audio_delivered=False,
                turn_id=None,
                response_id=None,
                turn_state={"gate": "closed", "preroll_frames": preroll_frames},
            )
        )
