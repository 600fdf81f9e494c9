"""Native events (session core -> projectors) and effects (session core -> its I/O shell).

Native events are dialect-neutral: the v3 projector maps them 1:1 onto wire events, the tiered projector fans
them out. Effects are instructions to the shell (run a prefill, start a synthesis, abort the model); they are
interleaved with events in one ordered output list so that, e.g., the model abort precedes a fatal error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..model.port import SessionPrompt
from ..records import record

Source = Literal["microphone", "typed", "assistant"]
"""Where a user turn came from; ``assistant``: no user input, the model was asked to speak first (a greeting)."""
ResponseStatus = Literal["completed", "cancelled", "failed"]
Disposition = Literal["completed", "cancelled", "replaced", "error"]


class NativeEvent:
    """Base class of everything a projector may turn into wire events."""

    __slots__ = ()


# --- configuration -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionConfigured(NativeEvent):
    """The model is prefilled for the effective prompt (the model-ready barrier)."""

    prompt: SessionPrompt
    client_event_id: str | None = None
    restarted: bool = True


# --- turns -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpeechStarted(NativeEvent):
    turn_id: str
    source: Source
    job_id: str | None
    correlation: int | str


@dataclass(frozen=True, slots=True)
class TurnStarted(NativeEvent):
    """Acknowledges a client ``turn_start`` barrier (also its idempotent re-acks)."""

    turn_id: str
    client_turn_id: int
    client_event_id: str


@dataclass(frozen=True, slots=True)
class TurnCommitted(NativeEvent):
    """Acknowledges a client ``commit`` barrier after settlement (also its idempotent re-acks)."""

    turn_id: str
    client_turn_id: int
    client_event_id: str


@record
class TranscriptDelta(NativeEvent):
    turn_id: str
    delta: str
    transcript: str
    source: Source
    job_id: str | None


@dataclass(frozen=True, slots=True)
class SpeechStopped(NativeEvent):
    turn_id: str
    source: Source
    job_id: str | None


@dataclass(frozen=True, slots=True)
class TranscriptCompleted(NativeEvent):
    turn_id: str
    transcript: str
    source: Source
    job_id: str | None

    @property
    def empty(self) -> bool:
        return not self.transcript


@dataclass(frozen=True, slots=True)
class ListenDecision(NativeEvent):
    """Model-owned turn taking decided not to respond: a commit or candidate turn held no speech.

    ``turn_id`` is the closed candidate turn, or None when no turn was open.
    """

    turn_id: str | None
    reason: Literal["silence_or_noise", "model_listen"]
    client_event_id: str | None = None


@dataclass(frozen=True, slots=True)
class InputCleared(NativeEvent):
    """``ClearInput`` dropped an open, uncommitted microphone turn (after its ``SpeechStopped``)."""

    turn_id: str


# --- responses ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResponseCreated(NativeEvent):
    turn_id: str
    response_id: str


@record
class TextDelta(NativeEvent):
    turn_id: str
    response_id: str
    delta: str
    text: str


@record
class AudioDelta(NativeEvent):
    """One position of output audio: PCM16 mono at 22,050 Hz (projectors encode it)."""

    turn_id: str
    response_id: str
    pcm: bytes


@dataclass(frozen=True, slots=True)
class TextDone(NativeEvent):
    turn_id: str
    response_id: str
    text: str

    @property
    def empty(self) -> bool:
        return not self.text


@dataclass(frozen=True, slots=True)
class AudioDone(NativeEvent):
    turn_id: str
    response_id: str
    empty: bool


@dataclass(frozen=True, slots=True)
class ResponseDone(NativeEvent):
    turn_id: str
    response_id: str
    status: ResponseStatus
    reason: str


# --- function calls ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FunctionCallPublished(NativeEvent):
    """A completed model call, shown to the client: ``arguments`` is a compact, sorted-key JSON object."""

    turn_id: str
    response_id: str
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class FunctionCallFailed(NativeEvent):
    turn_id: str
    response_id: str
    call_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class FunctionOutputApplied(NativeEvent):
    """The result was injected and post-function recovery is idle: held input may flow again."""

    call_id: str


# --- typed input -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TypedAccepted(NativeEvent):
    job_id: str


@dataclass(frozen=True, slots=True)
class TypedRejected(NativeEvent):
    job_id: Any
    reason: str


@dataclass(frozen=True, slots=True)
class TypedInjectionStarted(NativeEvent):
    job_id: str


@dataclass(frozen=True, slots=True)
class TypedInjectionFinished(NativeEvent):
    job_id: str
    disposition: Disposition


# --- errors, closure, telemetry ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Error(NativeEvent):
    code: str
    message: str
    fatal: bool
    client_event_id: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SessionClosed(NativeEvent):
    status: Literal["completed", "failed"]
    reason: str


@record
class PositionMetrics(NativeEvent):
    """Per-position telemetry (and per gated idle frame, with ``frame=None``): the liveness signal."""

    frame: int | None
    transport_frame: int | None
    kind: str
    inference_ms: float
    server_step_ms: float
    budget_ms: float
    over_budget: bool
    input_audio: bool
    output_audio: bool
    audio_delivered: bool
    turn_id: str | None
    response_id: str | None
    turn_state: dict[str, Any] = field(default_factory=dict)


# --- effects (shell instructions) --------------------------------------------------------------------------


class Effect:
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Prefill(Effect):
    """Run ``model.prefill(prompt)`` off the event loop, then call ``core.prefilled`` / ``core.prefill_failed``."""

    prompt: SessionPrompt


@dataclass(frozen=True, slots=True)
class StartSynthesis(Effect):
    """Synthesize typed text to 16 kHz PCM16, then call ``core.synthesis_done`` / ``core.synthesis_failed``."""

    job_id: str
    text: str


@dataclass(frozen=True, slots=True)
class CancelSynthesis(Effect):
    job_id: str


@dataclass(frozen=True, slots=True)
class AbortModel(Effect):
    """Abort the model session now (before any fatal error that follows is published)."""


Output = NativeEvent | Effect
