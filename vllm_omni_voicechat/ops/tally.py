"""What one session did, counted as it happens: a pure accumulator fed the session core's native events (and the
wire layer's own errors) with the injected ``now``. No locks, no I/O and no Prometheus: the server keeps one per
live session, folds it into its usage book when the session ends (``ops/usage.py``), and the exporters read them
at scrape time (``ops/prometheus.py``), so a position costs a few dictionary increments and nothing else.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from ..audio.frames import FRAME_SECONDS, OUTPUT_SAMPLE_RATE
from ..session import events as ev

STEP_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.16, 0.25, 0.5, 1.0, 2.5)
"""Model step (one position on the server: submit -> result), around the 80 ms budget."""
LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.08, 0.12, 0.16, 0.25, 0.4, 0.6, 1.0, 1.5, 2.5, 5.0, 10.0, 15.0)
"""Commit -> ``response.created`` / first audio, resume replay: what a user waits for."""
LATE_MS = 40.0
"""A position that started half a frame or more after it was due (its input frame had arrived) is late."""
MAX_OPEN_COMMITS = 64  # commits waiting for their response; older ones are forgotten (a commit may never answer)


class Histogram:
    """Fixed upper bounds (``le``) with per-bucket counts; the last bucket is +Inf."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def merge(self, other: Histogram) -> None:
        if other.bounds != self.bounds:
            raise ValueError("histograms with different bounds")
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.sum += other.sum
        self.count += other.count

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus buckets: (``le``, observations <= it), ending with ``+Inf``."""
        out, total = [], 0
        for bound, n in zip((*[repr(float(b)) for b in self.bounds], "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "sum": round(self.sum, 6),
                "buckets": {le: n for le, n in self.cumulative()}}


class Counts:
    """The counters a session keeps and a sum of sessions merges: counters by key, histograms bucket-wise."""

    # Slotted: a live session's tally is touched every position, among hundreds of sessions' state; its fields sit
    # with the object instead of in a separate values array.
    __slots__ = ("positions", "over_budget", "late", "late_inbox", "input_frames", "output_samples", "responses",
                 "function_calls", "typed_jobs", "errors", "step", "commit_to_created", "commit_to_first_audio")

    def __init__(self) -> None:
        self.positions: Counter[str] = Counter()
        self.over_budget = 0
        self.late = 0
        self.late_inbox = 0
        """Client messages the session read 40 ms or more after they arrived (loop lag: ``shell/aio.py``)."""
        self.input_frames = 0
        self.output_samples = 0
        self.responses: Counter[str] = Counter()
        self.function_calls: Counter[str] = Counter()
        self.typed_jobs: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.step = Histogram(STEP_BUCKETS_S)
        self.commit_to_created = Histogram(LATENCY_BUCKETS_S)
        self.commit_to_first_audio = Histogram(LATENCY_BUCKETS_S)

    def add(self, other: Counts) -> None:
        self.positions.update(other.positions)
        self.over_budget += other.over_budget
        self.late += other.late
        self.late_inbox += other.late_inbox
        self.input_frames += other.input_frames
        self.output_samples += other.output_samples
        self.responses.update(other.responses)
        self.function_calls.update(other.function_calls)
        self.typed_jobs.update(other.typed_jobs)
        self.errors.update(other.errors)
        self.step.merge(other.step)
        self.commit_to_created.merge(other.commit_to_created)
        self.commit_to_first_audio.merge(other.commit_to_first_audio)

    @property
    def position_count(self) -> int:
        return sum(self.positions.values())

    @property
    def audio_in_s(self) -> float:
        return self.input_frames * FRAME_SECONDS

    @property
    def audio_out_s(self) -> float:
        return self.output_samples / OUTPUT_SAMPLE_RATE

    def summary(self) -> dict[str, Any]:
        """Counts only: no audio, no text, no ids."""
        return {
            "positions": self.position_count,
            "positions_by_kind": dict(sorted(self.positions.items())),
            "over_budget_positions": self.over_budget,
            "late_positions": self.late,
            "late_inbox_messages": self.late_inbox,
            "audio_in_s": round(self.audio_in_s, 3),
            "audio_out_s": round(self.audio_out_s, 3),
            "responses": dict(sorted(self.responses.items())),
            "function_calls": dict(sorted(self.function_calls.items())),
            "typed_jobs": dict(sorted(self.typed_jobs.items())),
            "errors": dict(sorted(self.errors.items())),
        }


class SessionTally(Counts):
    """One session's counters. ``observe`` takes any output of the session core (effects and wire objects are
    ignored); ``wire_error`` counts an error the wire layer answered without the core (parse, validation,
    backpressure)."""

    __slots__ = ("dialect", "started_at", "on_error", "ended_at", "ended_reason", "_commits", "_awaiting_audio")

    def __init__(self, dialect: str, started_at: float, on_error: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self.dialect = dialect
        self.started_at = started_at
        self.on_error = on_error
        """Told the code of every error the session sends (the server logs it), as it is counted."""
        self.ended_at: float | None = None
        self.ended_reason: str | None = None
        self._commits: dict[str, float] = {}  # turn id -> when the user's turn was sealed
        self._awaiting_audio: dict[str, float] = {}  # response id -> its turn's commit time

    def observe(self, output: Any, now: float) -> None:
        self.observe_all((output,), now)

    def observe_all(self, outputs: Sequence[Any], now: float) -> None:
        for output in outputs:
            handler = _HANDLERS.get(type(output))
            if handler is not None:
                handler(self, output, now)

    def wire_error(self, code: str) -> None:
        self.errors[code] += 1
        if self.on_error is not None:
            self.on_error(code)

    def end(self, reason: str, now: float) -> None:
        """The session is over (``reason``: how it ended, from a bounded set). Idempotent: the first end wins."""
        if self.ended_at is None:
            self.ended_at = now
            self.ended_reason = reason

    # --- the native events ------------------------------------------------------------------------------

    def _position(self, o: ev.PositionMetrics, now: float) -> None:
        if o.frame is None:
            return  # a gated idle frame's liveness metrics: no model position ran
        self.positions[o.kind] += 1
        if o.over_budget:
            self.over_budget += 1
        if o.turn_state.get("late_ms", 0.0) >= LATE_MS:
            self.late += 1
        if o.input_audio:
            self.input_frames += 1
        step, value = self.step, o.server_step_ms / 1000.0  # Histogram.observe, inline: every position
        step.counts[bisect_left(step.bounds, value)] += 1
        step.sum += value
        step.count += 1

    def _sealed(self, turn_id: str, now: float) -> None:
        if turn_id not in self._commits:
            if len(self._commits) >= MAX_OPEN_COMMITS:
                self._commits.pop(next(iter(self._commits)))
            self._commits[turn_id] = now

    def _committed(self, o: ev.TurnCommitted, now: float) -> None:
        self._sealed(o.turn_id, now)

    def _speech_stopped(self, o: ev.SpeechStopped, now: float) -> None:
        if o.source == "microphone":  # a model-owned turn is sealed by the model's end of utterance
            self._sealed(o.turn_id, now)

    def _created(self, o: ev.ResponseCreated, now: float) -> None:
        sealed = self._commits.pop(o.turn_id, None)
        if sealed is not None:
            self.commit_to_created.observe(now - sealed)
            self._awaiting_audio[o.response_id] = sealed

    def _audio(self, o: ev.AudioDelta, now: float) -> None:
        self.output_samples += len(o.pcm) // 2
        sealed = self._awaiting_audio.pop(o.response_id, None)
        if sealed is not None:
            self.commit_to_first_audio.observe(now - sealed)

    def _done(self, o: ev.ResponseDone, now: float) -> None:
        self.responses[o.status] += 1
        self._awaiting_audio.pop(o.response_id, None)

    def _published(self, o: ev.FunctionCallPublished, now: float) -> None:
        self.function_calls["published"] += 1

    def _applied(self, o: ev.FunctionOutputApplied, now: float) -> None:
        self.function_calls["applied"] += 1

    def _call_failed(self, o: ev.FunctionCallFailed, now: float) -> None:
        self.function_calls["failed"] += 1

    def _typed_finished(self, o: ev.TypedInjectionFinished, now: float) -> None:
        self.typed_jobs[o.disposition] += 1

    def _typed_rejected(self, o: ev.TypedRejected, now: float) -> None:
        self.typed_jobs["rejected"] += 1

    def _error(self, o: ev.Error, now: float) -> None:
        self.errors[o.code] += 1
        if self.on_error is not None:
            self.on_error(o.code)
        if o.code == "function_call_loop_limit":
            self.function_calls["loop_limit"] += 1

    def summary(self) -> dict[str, Any]:
        return {"dialect": self.dialect, **super().summary()}


_HANDLERS = {
    ev.PositionMetrics: SessionTally._position,
    ev.TurnCommitted: SessionTally._committed,
    ev.SpeechStopped: SessionTally._speech_stopped,
    ev.ResponseCreated: SessionTally._created,
    ev.AudioDelta: SessionTally._audio,
    ev.ResponseDone: SessionTally._done,
    ev.FunctionCallPublished: SessionTally._published,
    ev.FunctionOutputApplied: SessionTally._applied,
    ev.FunctionCallFailed: SessionTally._call_failed,
    ev.TypedInjectionFinished: SessionTally._typed_finished,
    ev.TypedRejected: SessionTally._typed_rejected,
    ev.Error: SessionTally._error,
}
