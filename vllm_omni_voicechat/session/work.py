"""The session's work queue: client barriers ordered with the audio around them, one frozen item per kind.

The core turns the head item into a procedure (see ``procedures.py``); a microphone frame is queued as the gate's
own :class:`~vllm_omni_voicechat.session.gate.MicFrame`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .commands import CancelResponse, CommitInput, CommitTurn, RespondFirst, RespondNow, StartTurn, Stop
from .events import TurnCommitted, TurnStarted
from .gate import MicFrame

if TYPE_CHECKING:
    from .functions import Cycle
    from .typed import TypedJob


@dataclass(frozen=True, slots=True)
class TailPadding:
    """The zero-padded trailing partial frame of a commit."""

    pcm: bytes
    transport_frame: int
    ready: float = 0.0
    """When it could run (the commit)."""


@dataclass(frozen=True, slots=True)
class OpenTurn:
    """A client ``turn_start`` barrier: cancel what is open, then open the turn."""

    command: StartTurn
    turn_id: str


@dataclass(frozen=True, slots=True)
class CommitClientTurn:
    """A client ``commit`` barrier: settle to the fence, then the EOU."""

    command: CommitTurn
    turn_id: str


@dataclass(frozen=True, slots=True)
class Reack:
    """The idempotent acknowledgement of a remembered barrier, in order with the work around it."""

    event: TurnStarted | TurnCommitted


@dataclass(frozen=True, slots=True)
class EndInput:
    """A model-owned turn forced to its end (``CommitInput``)."""

    command: CommitInput


@dataclass(frozen=True, slots=True)
class Respond:
    """Fire the EOU a ``CommitInput(respond=False)`` held."""

    command: RespondNow


@dataclass(frozen=True, slots=True)
class SpeakFirst:
    """The model speaks first (``RespondFirst``)."""

    command: RespondFirst


@dataclass(frozen=True, slots=True)
class Cancel:
    """End the open response through the cancel tail."""

    command: CancelResponse


@dataclass(frozen=True, slots=True)
class InjectTyped:
    """Run an accepted typed job once its synthesis is ready."""

    job: TypedJob


@dataclass(frozen=True, slots=True)
class Recover:
    """Post-function recovery positions of a cycle whose result is being injected."""

    cycle: Cycle


@dataclass(frozen=True, slots=True)
class Close:
    """``session.stop``: flush partial audio, close the brackets, end the session."""

    command: Stop


WorkItem = (
    MicFrame | TailPadding | OpenTurn | CommitClientTurn | Reack | EndInput | Respond | Cancel | InjectTyped | Recover
    | Close
)


class WorkQueue(deque):
    """A deque of :data:`WorkItem` with the filters the core needs."""

    def audio_frames(self) -> int:
        """Queued audio positions (microphone frames and commit padding)."""
        return sum(1 for item in self if type(item) is MicFrame or type(item) is TailPadding)

    def drop_audio(self) -> None:
        """Drop queued microphone frames and commit padding (a clear)."""
        self._keep([item for item in self if type(item) is not MicFrame and type(item) is not TailPadding])

    def drop_job(self, job: TypedJob) -> None:
        """Drop the injection of ``job`` (replaced, cancelled or failed before it ran)."""
        self._keep([item for item in self if not (type(item) is InjectTyped and item.job is job)])

    def _keep(self, items: list[WorkItem]) -> None:
        self.clear()
        self.extend(items)
