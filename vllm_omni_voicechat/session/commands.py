"""Client commands: what a wire parser hands the session core, already shape-checked for its dialect."""

from __future__ import annotations

from dataclasses import dataclass

from ..model.port import SessionPrompt
from ..records import record


class Command:
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Configure(Command):
    """Apply a prompt (instructions + tools); acknowledged by ``SessionConfigured`` after prefill."""

    prompt: SessionPrompt
    client_event_id: str | None = None


@record
class AppendAudio(Command):
    """Decoded PCM16 mono 16 kHz microphone audio (any length, whole samples)."""

    pcm: bytes
    client_event_id: str | None = None
    wire_bytes: int = 0
    """Size of the client message that carried it (bounds the deferred FIFO); 0 when unknown."""
    arrived: float | None = None
    """When the host read the message that carried it: its frames are late from then, so a wait for the position in
    flight before the host could hand it over counts as lateness (None: when it is received). Pacing still counts
    from when it is received."""


@dataclass(frozen=True, slots=True)
class StartTurn(Command):
    client_turn_id: int
    client_event_id: str
    wire_bytes: int = 0


@dataclass(frozen=True, slots=True)
class CommitTurn(Command):
    client_turn_id: int
    client_event_id: str
    wire_bytes: int = 0


@dataclass(frozen=True, slots=True)
class SubmitFunctionOutput(Command):
    """A client's result for a published call (shape of the item already checked by the wire parser)."""

    call_id: object
    output: object
    model_output: object = None
    model_output_negotiated: bool = False
    client_event_id: str | None = None


@dataclass(frozen=True, slots=True)
class RequestTypedInput(Command):
    job_id: object
    text: object
    client_event_id: str | None = None


@dataclass(frozen=True, slots=True)
class Stop(Command):
    client_event_id: str | None = None


# --- model-owned turn policy (the tiered dialect) -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommitInput(Command):
    """Force the end of the open microphone turn now: pad, settle to the RNNT fence, fire the EOU.

    Without speech in the turn (silence or noise only) the turn closes without an EOU (``ListenDecision``).
    """

    client_event_id: str | None = None
    wire_bytes: int = 0
    respond: bool = True
    """False: settle and close the turn but hold its EOU for ``RespondNow`` (``auto_response: false``)."""


@dataclass(frozen=True, slots=True)
class RespondNow(Command):
    """Fire the EOU held by a ``CommitInput(respond=False)``: the model answers the committed turn."""

    client_event_id: str | None = None


@dataclass(frozen=True, slots=True)
class RespondFirst(Command):
    """The model speaks first (nothing to answer: a greeting): an empty turn of source ``assistant``, settled to the
    fence, then its EOU, exactly as a commit of nothing is on a client-owned turn."""

    client_event_id: str | None = None


@dataclass(frozen=True, slots=True)
class ClearInput(Command):
    """Drop uncommitted microphone input: the partial frame, the gate pre-roll, queued frames, an open turn."""

    client_event_id: str | None = None


@dataclass(frozen=True, slots=True)
class CancelResponse(Command):
    """End the open response through the cancel-to-terminal tail (agent EOS, suppressed output); the model's
    context survives. A no-op when nothing is open by the time it runs."""

    reason: str = "client_cancelled"
    client_event_id: str | None = None
