"""Microphone input at receipt: audio appends and the turns they belong to.

Client-owned turns open and commit on ``turn_start`` / ``commit`` barriers (a remembered barrier is re-acknowledged
in order, a conflicting one is fatal); model-owned turns end on a ``CommitInput`` and drop on a ``ClearInput``. Each
command is checked when it arrives and queues its work on the core's work queue, in order with the audio around it.
These functions keep no state: each is handed the core that received the command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .commands import AppendAudio, ClearInput, CommitInput, CommitTurn, StartTurn
from .events import Error, InputCleared, SpeechStopped, TurnCommitted, TurnStarted
from .failure import SessionFailure
from .lifecycle import TurnState
from .turns import Verdict
from .work import CommitClientTurn, EndInput, OpenTurn, Reack

if TYPE_CHECKING:
    from .core import SessionCore


def append(core: SessionCore, cmd: AppendAudio) -> None:
    if not core.configured:
        core.emit(Error("session_not_configured", "send session.update before audio", False, cmd.client_event_id))
        return
    if core.typed.job is not None:
        return  # server-side half duplex while a typed job runs
    if core.microphone.backlogged(len(cmd.pcm)):
        limit = core.config.max_queued_input_frames
        core.emit(Error("input_backpressure", f"more than {limit} input frames are waiting for the model; "
                        "audio refused (send in real time)", False, cmd.client_event_id,
                        {"max_queued_input_frames": limit}))
        return
    for frame, preroll in core.microphone.push(cmd.pcm, core.now, cmd.arrived):
        core.conversation.emit_gated_metrics(frame, preroll)


def _runs(core: SessionCore, verdict: Verdict, ack: type[TurnStarted] | type[TurnCommitted],
          cmd: StartTurn | CommitTurn) -> bool:
    """Whether a barrier runs: a remembered one is re-acknowledged in order, a conflicting one is fatal."""
    if verdict.action == "reack":
        assert verdict.turn_id is not None
        core.work.append(Reack(ack(verdict.turn_id, cmd.client_turn_id, cmd.client_event_id)))
        return False
    if verdict.action == "conflict":
        raise SessionFailure("input_turn_conflict", verdict.message, client_event_id=cmd.client_event_id,
                             details=verdict.details)
    return True


def start(core: SessionCore, cmd: StartTurn) -> None:
    verdict = core.turns.check_start(cmd.client_turn_id, typed_active=core.typed.job is not None)
    if not _runs(core, verdict, TurnStarted, cmd):
        return
    if not core.configured:
        core.emit(Error("session_not_configured", "send session.update before turn_start", False,
                        cmd.client_event_id))
        return
    turn_id = core.conversation.new_turn_id()
    core.turns.start(cmd.client_turn_id, turn_id)
    core.work.append(OpenTurn(cmd, turn_id))
    core.microphone.open(core.now)


def commit(core: SessionCore, cmd: CommitTurn) -> None:
    if not _runs(core, core.turns.check_commit(cmd.client_turn_id), TurnCommitted, cmd):
        return
    turn_id = core.turns.commit(cmd.client_turn_id)
    core.microphone.pad_turn(core.now)
    core.work.append(CommitClientTurn(cmd, turn_id))


def commit_input(core: SessionCore, cmd: CommitInput) -> None:
    """Model-owned turns: the client forces the end of the turn."""
    if not core.configured:
        core.emit(Error("session_not_configured", "send session.update before committing", False,
                        cmd.client_event_id))
        return
    core.microphone.end_input(core.now)
    core.work.append(EndInput(cmd))


def clear_input(core: SessionCore, cmd: ClearInput) -> None:
    """Model-owned turns: uncommitted audio is dropped, and a turn not yet settling with it."""
    core.microphone.clear()
    conv = core.conversation
    conv.pending_transcript = ""
    turn = conv.input_turn
    if turn is not None and turn.source == "microphone" and conv.lifecycle.state is TurnState.OPEN:
        conv.clear_input_turn()
        core.emit(SpeechStopped(turn.turn_id, "microphone", None))
        core.emit(InputCleared(turn.turn_id))
