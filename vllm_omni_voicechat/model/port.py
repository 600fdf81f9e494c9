"""The model port: the contract of one 80 ms model position, the only thing the runtime knows about a model.

A position takes one 1,280-sample 16 kHz frame (or a zero frame for a synthetic position) plus controls, and
returns a :class:`StepResult`. The simulator and the vLLM-Omni adapter both implement :class:`ModelPort`.
Everything here is plain data; no model implementation is imported.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..errors import VoicechatError
from ..records import record


class AgentControl(str, enum.Enum):
    """What the agent text channel did on a position."""

    PAD = "pad"
    """Silence, or speech whose text was already emitted ("keep listening")."""
    AGENT_BOS = "agent_bos"
    """The agent opened a response (user EOU -> agent BOS)."""
    AGENT_EOS = "agent_eos"
    """The agent closed its response (end of its speech)."""
    TEXT = "text"
    """An ordinary text token."""


class BoundaryPhase(str, enum.Enum):
    """Where the model's current response is on its way from BOS to the acoustic terminal."""

    IDLE = "idle"
    RESPONDING = "responding"
    INTERNAL_DRAIN = "internal_drain"
    TAIL_DRAINING = "tail_draining"
    COMPLETE = "complete"


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One normalized tool the model may call."""

    name: str
    """The advertised name (``-`` allowed); the model sees it as given."""
    description: str = ""
    """Free text for the prompt."""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    """JSON schema of the arguments object."""


@dataclass(frozen=True, slots=True)
class SessionPrompt:
    """What a model session is prefilled with before its first position."""

    instructions: str = ""
    """System instructions (the effective prompt text before the tool block)."""
    tools: tuple[ToolSpec, ...] = ()
    """Tools offered to the function channel; empty means no tool block."""


@record
class PositionControls:
    """Controls applied on one position. All default to "do nothing"."""

    eou_now: bool = False
    """Request the user EOU on this position: the model consumes it and opens the agent turn (agent BOS)."""
    eou_at_fence: int | None = None
    """Arm a user EOU that fires on the position whose RNNT blank count reaches this fence. That fence position
    is also the agent BOS position (fused). Stays armed across positions until it fires or is cancelled."""
    cancel_eou: bool = False
    """Cancel an armed ``eou_at_fence`` request."""
    agent_eos: bool = False
    """Request agent EOS: end the current response (barge-in, watchdogs)."""
    force_text_pad: bool = False
    """Force the text channel's effective token to PAD on this position."""
    tool_result_tokens: tuple[str, ...] = ()
    """Queue these tool-result tokens for injection into the function channel, one per position."""
    reset: bool = False
    """Reset the model session to its freshly prefilled state before this position (abort recovery)."""
    pre_eou: bool = False
    """A client-owned settlement position: function-head predictions are recorded and forced to PAD."""


NO_CONTROLS = PositionControls()


@record
class PositionInput:
    """One model position's input."""

    pcm: bytes
    """Exactly 2,560 bytes: 1,280 PCM16 samples at 16 kHz. All zero for a synthetic position."""
    controls: PositionControls = NO_CONTROLS
    """Controls applied on this position."""
    synthetic: bool = False
    """True when the frame is a zero-input position the protocol added (no client audio behind it)."""
    ready: float | None = None
    """When the position could have run (the runner's due time, on the host's monotonic clock). A model home that
    holds positions to batch them across sessions paces them from it."""
    arrived: float | None = None
    """When its audio reached the host, if before ``ready`` (None: ``ready``): such a model home measures its
    lateness from it (``StepTimings.late_ms``)."""


@record
class AgentOutput:
    """The agent text channel on one position."""

    control: AgentControl = AgentControl.PAD
    """What the channel did (PAD, BOS, EOS or a text token)."""
    token_id: int | None = None
    """The effective token id (None when the model does not expose ids)."""
    delta: str = ""
    """Text this position adds to the response transcript ('' for PAD/BOS/EOS)."""


@record
class RnntEvidence:
    """User-side evidence from the RNNT decoder on one position."""

    blank: bool = True
    """True when the RNNT emitted no token on this position."""
    blank_count: int = 0
    """Consecutive blank positions up to and including this one (the settlement fence counts these)."""
    text_delta: str = ""
    """User transcript text decoded on this position ('' when blank or mid-word)."""
    speech_confirmed: bool = False
    """True when this position carried speech evidence (a decoded token or speech energy)."""


@dataclass(frozen=True, slots=True)
class FunctionState:
    """The function channel on one position."""

    token: str | None = None
    """The effective function-channel token text (None for PAD)."""
    raw_token: str | None = None
    """The raw prediction before PAD forcing (telemetry; differs from ``token`` when forced)."""
    active: bool = False
    """A call is being emitted (between SOTC and EOTC)."""
    awaiting_result: bool = False
    """A call completed and the model waits for its result."""
    injecting: bool = False
    """Result tokens are being force-fed into the channel."""
    awaiting_eotr: bool = False
    """The result is injected; the channel has not closed it with EOTR yet."""
    forced_tokens: int = 0
    """Result tokens still queued for injection."""
    background: bool = False
    """A background (asynchronous) function worker is running."""
    post_fc_bos_pending: bool = False
    """Deferred BOS: the model will force agent BOS once the injected result is through (not a cycle flag)."""
    latched: bool = False
    """An SOTC predicted on the EOU-consuming position is staged in the one-token latch, to be replayed."""

    @property
    def busy(self) -> bool:
        """Any function-cycle flag set: the cycle is not idle."""
        return bool(
            self.latched
            or self.active
            or self.awaiting_result
            or self.injecting
            or self.awaiting_eotr
            or self.forced_tokens
            or self.background
        )


IDLE_FUNCTION = FunctionState()


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call parsed from a completed ``<TOOLCALL>[...]</TOOLCALL>`` payload."""

    name: str
    """The tool name as the model wrote it."""
    arguments: dict[str, Any]
    """The arguments object (a JSON string payload is decoded)."""
    raw: str = ""
    """The raw payload between SOTC and EOTC."""


@record
class ResponseBoundary:
    """Where the response stands after this position."""

    phase: BoundaryPhase = BoundaryPhase.IDLE
    """Phase after this position."""
    started: bool = False
    """This position opened a response (its agent BOS)."""
    ended: bool = False
    """This position is the response's acoustic terminal: its audio is the last of the response."""
    reason: str | None = None
    """Why it ended (EOS reason or boundary reason, e.g. ``post_eos_audio_silence``); set with ``ended``."""


@record
class StepTimings:
    """Timings the model reports for one position."""

    inference_ms: float = 0.0
    """Time spent inside the model for this position."""
    held_ms: float = 0.0
    """Time the model home held the position before running it, by policy (batching it with other sessions'
    positions; bounded by its slot). Part of the step, not of the budget."""
    late_ms: float | None = None
    """How late the position ran, from a model home that holds positions (the hold is not lateness); None: the
    runner's own measure (started after its due time)."""
    batched_with: int = 1
    """How many positions, this one included, the model home ran together (other sessions' positions of the same
    tick; 1: it ran alone)."""


@record
class StepResult:
    """Everything one position produced."""

    audio: bytes
    """Output audio: 1,764 PCM16 samples at 22.05 kHz (3,528 bytes); may be silent."""
    agent: AgentOutput = AgentOutput()
    """The agent text channel."""
    rnnt: RnntEvidence = RnntEvidence()
    """User evidence from the RNNT decoder."""
    function: FunctionState = IDLE_FUNCTION
    """The function channel and its cycle flags."""
    tool_call: ToolCall | None = None
    """A parsed tool call, on the position whose EOTC completed it."""
    boundary: ResponseBoundary = ResponseBoundary()
    """Response-boundary info."""
    eou_consumed: bool = False
    """This position consumed a user EOU (``eou_now`` or a fired ``eou_at_fence``)."""
    fence_blank_count: int | None = None
    """Blank count seen when an armed fence fired (the fused-EOU marker's ``blank_count_at_check``)."""
    timings: StepTimings = StepTimings()
    """Model-side timings."""
    telemetry: dict[str, Any] = field(default_factory=dict)
    """Model telemetry for the turn trace (e.g. PAD-forcing and SOTC-latch counts and frame edges)."""


class ModelError(VoicechatError, RuntimeError):
    """A model failure: the session that saw it is over (fatal ``internal_error``)."""


class ModelTimeout(ModelError):
    """The model did not answer a position within its bound: the session is over like any model failure, and the
    model home itself may be stalled (a server reports itself degraded until a later position completes)."""


@runtime_checkable
class ModelPort(Protocol):
    """One live model session. Calls are blocking and come from one thread at a time.

    A port may also say ``inline_steps = True`` (read with ``getattr``, default False): its ``step`` takes
    microseconds, so an asyncio host runs it on its loop instead of hopping to a thread (prefill and abort still
    go to the thread)."""

    def prefill(self, prompt: SessionPrompt) -> None:
        """Start (or restart) the model session with this prompt: the model-ready barrier waits for it."""

    def step(self, position: PositionInput) -> StepResult:
        """Advance exactly one 80 ms position."""

    def abort(self) -> None:
        """Abort the session; no state may be left half-advanced. Idempotent."""


__all__ = [
    "AgentControl",
    "AgentOutput",
    "BoundaryPhase",
    "FunctionState",
    "IDLE_FUNCTION",
    "ModelError",
    "ModelPort",
    "ModelTimeout",
    "NO_CONTROLS",
    "PositionControls",
    "PositionInput",
    "ResponseBoundary",
    "RnntEvidence",
    "SessionPrompt",
    "StepResult",
    "StepTimings",
    "ToolCall",
    "ToolSpec",
]
