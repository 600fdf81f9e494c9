"""The session's multi-position procedures.

Each work item runs as a generator that yields position plans and receives their step results, so sequences such
as cancel tail -> turn start, or settlement -> fused EOU/BOS, read top to bottom. A procedure publishes what each
position shows through the core's conversation and ends the session by raising ``SessionFailure``. Procedures keep no
state of their own: each is handed the core it runs on (a procedure's generator holds it only while it runs).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..audio.frames import INPUT_FRAME_BYTES, SILENT_INPUT_FRAME, FrameAssembler
from ..model.port import NO_CONTROLS, AgentControl, PositionControls, StepResult
from ..runner.stage0 import PositionKind
from .commands import CancelResponse, Command, CommitInput, CommitTurn, RespondFirst, StartTurn
from .lifecycle import InputTurn, TurnMove, TurnState
from .events import (
    AbortModel,
    ListenDecision,
    SessionClosed,
    TranscriptDelta,
    TurnCommitted,
    TurnStarted,
    TypedInjectionStarted,
)
from .failure import SessionFailure
from .settlement import Settlement, bos_contract_failure

if TYPE_CHECKING:
    from .core import SessionCore
    from .typed import TypedJob


@dataclass(slots=True)
class Plan:
    """The next position a procedure asks for. (``SessionCore._settlement_input`` builds plans positionally: in this
    field order.)"""

    kind: PositionKind
    pcm: bytes = SILENT_INPUT_FRAME
    controls: PositionControls = NO_CONTROLS
    transport_frame: int | None = None
    ready: float | None = None
    """A microphone frame's ready time (``MicFrame.ready``): it is due from then."""
    arrived: float | None = None
    """When a microphone frame's audio reached the host (``MicFrame.arrived``): it is late from then."""
    input_audio: bool | None = None
    """Whether ``pcm`` is audio rather than zeros (None: the kind says)."""
    queued_audio: bool = False
    """A settlement position that a quiet microphone frame queued after the commit may feed instead of zeros (the
    core decides when it starts, ``SessionCore._settlement_input``)."""


def settlement_plan(controls: PositionControls) -> Plan:
    return Plan(PositionKind.SETTLEMENT, SILENT_INPUT_FRAME, controls, queued_audio=True)


Procedure = Generator[Plan, StepResult, list[Command] | None]
"""A procedure's return: input held during a function cycle, handed back for the core to dispatch again."""


# ================================================================ microphone audio

def frame(core: SessionCore, kind: PositionKind, pcm: bytes, transport_frame: int | None, loud: bool = False,
          ready: float | None = None, arrived: float | None = None) -> Procedure:
    conv = core.conversation
    result = yield Plan(kind, pcm, NO_CONTROLS, transport_frame, ready, arrived)
    if not core.model_turns:
        conv.publish(core, result)
        return
    turn = conv.input_turn
    if turn is None and core.typed.job is None and (loud or result.rnnt.speech_confirmed):
        # Model-owned onset: speech opens a candidate turn (its RNNT words so far come with it).
        turn = conv.open_input_turn(conv.new_turn_id(), "microphone", None, "")
        if turn.transcript:
            core.emit(TranscriptDelta(turn.turn_id, turn.transcript, turn.transcript, "microphone", None))
    conv.publish(core, result)
    if turn is None or turn is not conv.input_turn or conv.lifecycle.settling:
        return
    turn.quiet = 0 if loud or result.rnnt.speech_confirmed else turn.quiet + 1
    fence = core.eou_blank_frames
    if turn.transcript and core.auto_eou and conv.blank_count >= fence - 1:
        yield from _model_eou(core, turn, "new_response")
    elif not turn.transcript and turn.quiet >= fence and conv.blank_count >= fence:
        _listen(core, "model_listen", None)


def _model_eou(core: SessionCore, turn: InputTurn, cancel_reason: str) -> Procedure:
    """End a model-owned turn: cancel a response it overlaps, then settle to the fence and fire the EOU."""
    core.conversation.lifecycle.settle()
    if core.must_cancel:
        yield from cancel_tail(core, cancel_reason)
    yield from _settle_and_eou(core, None)


def _listen(core: SessionCore, reason: str, client_event_id: str | None) -> None:
    """A listen decision: the open turn, if any, held no words the model heard."""
    turn_id = core.conversation.close_input_turn(TurnMove.LISTEN)
    core.emit(ListenDecision(turn_id, reason, client_event_id))  # type: ignore[arg-type]


# ================================================================ barriers

def end_input(core: SessionCore, cmd: CommitInput) -> Procedure:
    conv = core.conversation
    lifecycle = conv.lifecycle
    turn = lifecycle.turn
    if turn is None:
        if lifecycle.state is not TurnState.ANSWERED:
            _listen(core, "silence_or_noise", cmd.client_event_id)
        return  # the model-owned EOU already took this audio: a redundant commit is benign
    if lifecycle.settling:
        return
    lifecycle.settle()
    if core.must_cancel:
        yield from cancel_tail(core, "new_response")
    # Words still being decoded arrive during settlement; without any, the turn ends as a listen decision.
    steps = 0
    core.settlement_audio = True
    try:
        while not turn.transcript and conv.blank_count < core.eou_blank_frames:
            result = yield settlement_plan(PositionControls(pre_eou=True))
            conv.publish(core, result)
            steps += 1
            if steps >= 2 * core.eou_blank_frames:
                break
    finally:
        core.settlement_audio = False
    if not turn.transcript:
        _listen(core, "silence_or_noise", cmd.client_event_id)
        return
    yield from _settle_and_eou(core, None, hold=not cmd.respond, forced=cmd.respond)


def respond(core: SessionCore) -> Procedure:
    turn = core.conversation.lifecycle.respond()
    if turn is None:
        return
    if core.must_cancel:
        yield from cancel_tail(core, "new_response")
    yield from _eou_position(core, turn)


def speak_first(core: SessionCore, cmd: RespondFirst) -> Procedure:
    """An empty turn and its EOU: the model speaks from its prompt (the commit of nothing a client-owned turn
    allows, for a client that asks for a response before anyone spoke)."""
    if core.must_cancel:
        yield from cancel_tail(core, "new_response")
    conv = core.conversation
    if conv.input_turn is not None:
        return  # a user turn is open: it is what gets answered
    conv.open_input_turn(conv.new_turn_id(), "assistant", None, cmd.client_event_id or "")
    conv.lifecycle.settle()
    yield from _settle_and_eou(core, None)


def cancel(core: SessionCore, cmd: CancelResponse) -> Procedure:
    if core.functions.cycle is None and core.must_cancel:  # a published call's wait is ended by its output
        yield from cancel_tail(core, cmd.reason)


def open_turn(core: SessionCore, cmd: StartTurn, turn_id: str) -> Procedure:
    if core.must_cancel:
        yield from cancel_tail(core, "client_vad")
    turn = core.conversation.open_input_turn(turn_id, "microphone", None, cmd.client_turn_id)
    core.emit(TurnStarted(turn_id, cmd.client_turn_id, cmd.client_event_id))
    if turn.transcript:
        core.emit(TranscriptDelta(turn_id, turn.transcript, turn.transcript, "microphone", None))


def commit_turn(core: SessionCore, cmd: CommitTurn, turn_id: str) -> Procedure:
    if core.must_cancel:
        # The model self-started during the user turn: drain it before settling (§6.6).
        yield from cancel_tail(core, "pre_eou_activity_recovery:commit")
    ack = TurnCommitted(turn_id, cmd.client_turn_id, cmd.client_event_id)
    core.conversation.lifecycle.settle()
    yield from _settle_and_eou(core, ack)


def typed(core: SessionCore, job: TypedJob) -> Procedure:
    conv = core.conversation
    job.turn_id = conv.new_turn_id()
    if core.must_cancel:
        yield from cancel_tail(core, "typed_input")
    frames = FrameAssembler(INPUT_FRAME_BYTES)
    pcm_frames = frames.push(job.pcm)
    tail = frames.pad()
    if tail is not None:
        pcm_frames.append(tail)
    for i, pcm in enumerate(pcm_frames):
        if i == 0:
            # The commit point: emitted immediately before the first model mutation.
            job.state = "mutated"
            if conv.input_turn is not None:
                conv.close_input_turn(TurnMove.SUPERSEDE)  # the user spoke, then typed: one answer, to both
            core.emit(TypedInjectionStarted(job.job_id))
            conv.open_input_turn(job.turn_id, "typed", job.job_id, job.job_id)
        result = yield Plan(PositionKind.TYPED, pcm)
        conv.publish(core, result)
    conv.lifecycle.settle()
    yield from _settle_and_eou(core, None)
    core.typed.finish(core, job, "completed")


def stop(core: SessionCore) -> Procedure:
    tail = core.microphone.final_tail()
    if tail is not None and core.model_started:
        result = yield Plan(PositionKind.FINAL, tail)
        core.conversation.publish(core, result)
    elif not core.model_started and core.configured:
        core.emit(AbortModel())
    core.conversation.close_brackets("completed", "client_stop")
    core.emit(SessionClosed("completed", "client_stop"))
    core.close()


# ================================================================ cancel, settlement, EOU

def cancel_tail(core: SessionCore, reason: str) -> Procedure:
    """Drive the model to quiet with output suppressed (agent EOS, then silent positions); close the open
    response as cancelled.

    The acoustic tail is bounded at ``cancel_tail_max_positions``; positions spent while the function channel
    drains a call that was never published (its result is the ``cancelled_by_new_client_turn`` error) count
    against the post-function recovery bound instead.
    """
    conv = core.conversation
    response = conv.response
    controls = PositionControls(agent_eos=True)
    tail = drain = 0
    while True:
        result = yield Plan(PositionKind.CANCEL_TAIL, SILENT_INPUT_FRAME, controls)
        controls = NO_CONTROLS
        conv.publish(core, result, suppress=True)
        fn = result.function
        busy = fn.busy or fn.post_fc_bos_pending
        terminal = result.boundary.ended or result.boundary.phase.value in ("idle", "complete")
        if not busy and terminal:
            if conv.response is not None:
                conv.close_response("cancelled", reason)
            core.functions.pending_bos_turn = None  # an unpublished deferred-BOS cycle was interrupted
            return
        if busy:
            drain += 1
        else:
            tail += 1
        if tail >= core.config.cancel_tail_max_positions or drain >= core.config.function_recovery_max_frames:
            break
    raise SessionFailure(
        "response_cancel_timeout",
        f"the model did not reach its acoustic terminal within {core.config.cancel_tail_max_positions} positions",
        details={"response_id": response.response_id, "turn_id": response.turn_id} if response else {},
    )


def _settle_and_eou(core: SessionCore, ack: TurnCommitted | None, *, hold: bool = False,
                    forced: bool = False) -> Procedure:
    """Settle the settling turn to the RNNT fence, then the explicit EOU: fused into the fence position without
    tools.

    ``hold``: settle to the fence (the transcript is complete), close the turn and hold its EOU for
    ``RespondNow`` (``CommitInput(respond=False)``). ``forced``: the client's commit forces this EOU."""
    conv = core.conversation
    turn = conv.input_turn
    assert turn is not None and conv.lifecycle.settling
    fused = not hold and not (core.prompt and core.prompt.tools)
    settlement = Settlement(fence=core.config.settlement_blank_frames, fused=fused, blank_count=conv.blank_count)
    core.settlement_audio = True
    try:
        while not (not fused and settlement.fence_met):
            controls = settlement.next_controls()
            result = yield settlement_plan(controls)
            outcome = settlement.on_result(result, controls)
            if outcome.kind == "fatal":
                if outcome.publish:
                    conv.publish(core, result)
                raise SessionFailure(
                    outcome.code,
                    outcome.message,
                    details={"settlement": outcome.details, "source": turn.source, "job_id": turn.job_id},
                )
            if outcome.kind == "fused_terminal":
                conv.eou_turn_id = turn.turn_id
                conv.publish(core, result, ack=ack, close_turn=True)
                conv.lifecycle.answered(forced=forced)
                return
            conv.publish(core, result)
            if outcome.kind == "fence_reached":
                break
    finally:
        core.settlement_audio = False
    # Separate EOU (tools): commit after settlement, then one EOU position so the function guard covers it.
    if ack is not None:
        core.emit(ack)
    conv.close_input_turn()
    if hold:
        conv.lifecycle.hold(turn)
        return
    yield from _eou_position(core, turn, forced=forced)


def _eou_position(core: SessionCore, turn: InputTurn, *, forced: bool = False) -> Procedure:
    """One explicit EOU position: agent BOS, or a function cycle whose BOS is deferred."""
    conv = core.conversation
    result = yield Plan(PositionKind.EOU, SILENT_INPUT_FRAME, PositionControls(eou_now=True))
    conv.eou_turn_id = turn.turn_id
    conv.lifecycle.answered(forced=forced)
    details = {"source": turn.source, "job_id": turn.job_id}
    if result.agent.control is not AgentControl.AGENT_BOS:
        if result.function.busy:
            # The EOU position opened a function cycle: BOS is expected after its result (deferred BOS).
            if core.functions.pending_bos_turn is not None:
                raise SessionFailure("overlapping_bos_expectation", "a deferred BOS is already pending",
                                     details=details)
            core.functions.pending_bos_turn = turn.turn_id
            conv.publish(core, result, eou_turn_id=turn.turn_id)
            return
        raise SessionFailure("missing_terminal_bos",
                             "the EOU position produced neither agent BOS nor a function cycle", details=details)
    failure = bos_contract_failure(result)
    if failure is not None:
        raise SessionFailure("separate_eou_contract_failure", failure, details=details)
    conv.publish(core, result, eou_turn_id=turn.turn_id)
