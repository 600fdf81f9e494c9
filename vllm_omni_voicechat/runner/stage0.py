"""The Stage 0 runner: the 80 ms model clock.

It numbers model positions, enforces the session position guard before every position (synthetic ones
included), applies the pacing policy and measures each step. It never sleeps and never reads a clock: every
method takes ``now`` (seconds on any monotonic timeline).

Pacing policy:
- real frames, typed-input audio, settlement, the EOU position and cancel tails are **unpaced**: due at once, a
  microphone frame from when it could run (its ``ready`` time), so its wait behind other positions is lateness, and
  late from when its audio reached the host (``arrived``, when the host could hand it over only after the position
  in flight);
- post-tool **recovery** positions keep a >= 80 ms cadence between starts;
- **response silence** (a response is open, no real frame queued) is due on the 80 ms grid anchored at the
  previous position, so a response finishes when the client stops streaming; after a real frame the first one
  waits a half-frame grace so a client streaming in real time is not overtaken by synthetic positions.

A model home shared by many sessions may hold a position to run it with other sessions' positions (``tick.py``,
the engine tick); it reports the hold and its own lateness (``StepTimings``), and the runner takes them.
"""

from __future__ import annotations

import enum

from ..audio.frames import FRAME_SECONDS
from ..errors import VoicechatError
from ..model.port import PositionControls, PositionInput, StepResult
from ..records import record

DEFAULT_MAX_SESSION_MODEL_FRAMES = 12_000
BUDGET_MS = 80.0


class PositionKind(str, enum.Enum):
    REAL = "real"
    """A client microphone frame (pre-roll frames included)."""
    COMMIT_PADDING = "commit_tail_padding"
    """The zero-padded trailing partial frame of a commit."""
    TYPED = "typed"
    """A frame of synthesized typed-input audio."""
    SETTLEMENT = "settlement"
    """A position advancing the RNNT blank count to the fence: zero input, or a quiet microphone frame queued after
    the commit (``Position.input_audio``)."""
    EOU = "eou"
    """The separate zero-input EOU position (sessions with tools)."""
    CANCEL_TAIL = "cancel_tail"
    """A zero-input position draining a cancelled response to its acoustic terminal."""
    RECOVERY = "recovery"
    """A zero-input post-tool recovery position (>= 80 ms cadence)."""
    RESPONSE_SILENCE = "response_silence"
    """A zero-input position keeping an open response moving when no audio arrives."""
    FINAL = "final"
    """The last position on ``session.stop`` (flushes partial PCM)."""

    @property
    def synthetic(self) -> bool:
        return self in _SYNTHETIC

    @property
    def paced(self) -> bool:
        return self in (PositionKind.RECOVERY, PositionKind.RESPONSE_SILENCE)


_SYNTHETIC = frozenset(
    {
        PositionKind.SETTLEMENT,
        PositionKind.EOU,
        PositionKind.CANCEL_TAIL,
        PositionKind.RECOVERY,
        PositionKind.RESPONSE_SILENCE,
    }
)


@record
class Position:
    """A position the runner has begun: hand ``input`` to the model, then call :meth:`Stage0Runner.finish`."""

    index: int
    kind: PositionKind
    input: PositionInput
    transport_frame: int | None
    due: float
    started: float
    arrived: float | None = None
    """When its audio reached the host, if before ``due``: the position is late from then (None: ``due``)."""
    input_audio: bool = True
    """It runs a client's (or typed input's) audio, not zeros."""

    @property
    def late_from(self) -> float:
        return self.due if self.arrived is None else min(self.arrived, self.due)


@record
class StepMetrics:
    frame: int
    transport_frame: int | None
    kind: PositionKind
    inference_ms: float
    server_step_ms: float
    late_ms: float
    budget_ms: float
    over_budget: bool
    """The step without the model home's batching hold took longer than the budget."""
    input_audio: bool
    """The position ran audio (``Position.input_audio``)."""
    held_ms: float = 0.0
    """The model home's batching hold (``StepTimings.held_ms``)."""


class PositionLimitReached(VoicechatError):
    def __init__(self, positions: int, limit: int) -> None:
        super().__init__(f"session position limit reached: {positions} of {limit}")
        self.positions = positions
        self.limit = limit


class Stage0Runner:
    def __init__(
        self,
        *,
        max_positions: int = DEFAULT_MAX_SESSION_MODEL_FRAMES,
        frame_seconds: float = FRAME_SECONDS,
        silence_grace: float | None = None,
    ) -> None:
        if max_positions < 1:
            raise ValueError("max_positions must be >= 1")
        self.max_positions = max_positions
        self.frame_seconds = frame_seconds
        self.silence_grace = frame_seconds / 2 if silence_grace is None else silence_grace
        self.positions_run = 0
        self.in_flight: Position | None = None
        self._grid: float | None = None
        self._last_kind: PositionKind | None = None
        self._last_recovery_start: float | None = None

    # --- pacing ---------------------------------------------------------------------------------------------

    def due_at(self, kind: PositionKind, now: float, ready: float | None = None) -> float:
        """When a position of ``kind`` may start, given what ran before (``now`` when it may start at once; an unpaced
        position that could run earlier, ``ready``, was due then)."""
        if kind is PositionKind.RECOVERY:
            if self._last_recovery_start is None:
                return now
            return max(now, self._last_recovery_start + self.frame_seconds)
        if kind is PositionKind.RESPONSE_SILENCE:
            if self._grid is None:
                return now
            grace = 0.0 if self._last_kind is PositionKind.RESPONSE_SILENCE else self.silence_grace
            return self._grid + self.frame_seconds + grace
        return now if ready is None else ready

    # --- positions ------------------------------------------------------------------------------------------

    def check_guard(self) -> None:
        if self.positions_run >= self.max_positions:
            raise PositionLimitReached(self.positions_run, self.max_positions)

    def begin(
        self,
        kind: PositionKind,
        pcm: bytes,
        controls: PositionControls,
        transport_frame: int | None,
        now: float,
        due: float | None = None,
        arrived: float | None = None,
        input_audio: bool | None = None,
    ) -> Position:
        """Start one position; raises :class:`PositionLimitReached` instead when the guard is hit. ``arrived``: when
        a microphone frame's audio reached the host, if before it was handed over (``due``): its lateness counts from
        then. ``input_audio``: whether ``pcm`` is audio rather than zeros (default: the kind says)."""
        if self.in_flight is not None:
            raise RuntimeError("a position is already in flight")
        self.check_guard()
        due = now if due is None else due
        synthetic = kind.synthetic if input_audio is None else not input_audio
        # Records made every position are built positionally, in field order: a keyword argument costs ~35 ns on
        # CPython 3.11 (tests assert every field).
        position = Position(self.positions_run, kind, PositionInput(pcm, controls, synthetic, due, arrived),
                            transport_frame, due, now, arrived, not synthetic)
        self.positions_run += 1
        self.in_flight = position
        # Silence stays on its own grid (no drift); any other position re-anchors the grid where it starts.
        self._grid = due if kind is PositionKind.RESPONSE_SILENCE else now
        self._last_kind = kind
        if kind is PositionKind.RECOVERY:
            self._last_recovery_start = now
        return position

    def finish(self, position: Position, result: StepResult | None, now: float) -> StepMetrics:
        if self.in_flight is not position:
            raise RuntimeError("finish() for a position that is not in flight")
        self.in_flight = None
        step_ms = (now - position.started) * 1000.0
        timings = result.timings if result is not None else None
        late_ms = timings.late_ms if timings is not None else None
        if late_ms is None:
            late_ms = max(0.0, (position.started - position.late_from) * 1000.0)
        held_ms = timings.held_ms if timings is not None else 0.0
        return StepMetrics(  # positionally, in field order (see begin)
            position.index,
            position.transport_frame,
            position.kind,
            timings.inference_ms if timings is not None else 0.0,
            step_ms,  # server_step_ms
            late_ms,
            BUDGET_MS,
            step_ms - held_ms > BUDGET_MS,  # over_budget
            position.input_audio,
            held_ms,
        )
