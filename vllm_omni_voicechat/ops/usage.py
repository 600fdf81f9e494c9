"""The server's usage book: admissions, refusals and ends, every live session's tally, and the folded tallies of
the sessions that ended (per dialect, merged by key, never overwritten). Pure bookkeeping with the time injected;
``/v1/usage``, ``/v1/sessions``, the Prometheus collector and the admission queue's wait estimate read it.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from .tally import LATENCY_BUCKETS_S, Counts, Histogram, SessionTally

RECENT_SESSIONS = 256  # ended sessions kept for /v1/usage (their summaries only)
DURATION_SAMPLES = 64  # recent session durations behind the admission queue's estimate


class Totals(Counts):
    """Tallies merged (``add``), with how many sessions went in."""

    __slots__ = ("sessions",)

    def __init__(self) -> None:
        super().__init__()
        self.sessions = 0

    def add(self, other: Counts) -> None:
        self.sessions += other.sessions if isinstance(other, Totals) else 1
        super().add(other)

    def to_json(self) -> dict[str, Any]:
        return {
            "sessions": self.sessions,
            **self.summary(),
            "model_step_seconds": self.step.to_json(),
            "commit_to_response_created_seconds": self.commit_to_created.to_json(),
            "commit_to_first_audio_seconds": self.commit_to_first_audio.to_json(),
        }


class UsageBook:
    def __init__(self, started_at: float) -> None:
        self.started_at = started_at
        self.admitted: Counter[str] = Counter()  # dialect
        self.rejected: Counter[tuple[str, str]] = Counter()  # (dialect, reason)
        self.ended: Counter[tuple[str, str]] = Counter()  # (dialect, reason)
        self.live: dict[str, SessionTally] = {}  # session id -> its tally (ids never leave this object as labels)
        self.folded: dict[str, Totals] = {}  # dialect -> the ended sessions' tallies
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_SESSIONS)
        self.durations: deque[float] = deque(maxlen=DURATION_SAMPLES)
        self.resume_replay = Histogram(LATENCY_BUCKETS_S)
        self.resumes: Counter[str] = Counter()  # outcome: resumed | refused

    # --- what the server reports -----------------------------------------------------------------------

    def admit(self, session_id: str, dialect: str, now: float,
              on_error: Callable[[str], None] | None = None) -> SessionTally:
        tally = SessionTally(dialect, now, on_error)
        self.admitted[dialect] += 1
        self.live[session_id] = tally
        return tally

    def reject(self, dialect: str, reason: str) -> None:
        self.rejected[(dialect, reason)] += 1

    def end(self, session_id: str, reason: str, now: float) -> None:
        """Fold a live session's tally into its dialect's totals (once; a second end is ignored)."""
        tally = self.live.pop(session_id, None)
        if tally is None:
            return
        tally.end(reason, now)
        self.ended[(tally.dialect, tally.ended_reason or reason)] += 1
        self.folded.setdefault(tally.dialect, Totals()).add(tally)
        duration = now - tally.started_at
        self.durations.append(duration)
        self.recent.append({**tally.summary(), "ended_reason": tally.ended_reason,
                            "duration_s": round(duration, 3), "ended_at_s": round(now - self.started_at, 3)})

    def resumed(self, replay_s: float) -> None:
        self.resumes["resumed"] += 1
        self.resume_replay.observe(replay_s)

    def resume_refused(self) -> None:
        self.resumes["refused"] += 1

    # --- reading -----------------------------------------------------------------------------------------

    def totals(self) -> dict[str, Totals]:
        """Per dialect: the ended sessions plus the live ones so far (monotonic, as counters must be)."""
        out: dict[str, Totals] = {}
        for dialect, folded in list(self.folded.items()):
            out.setdefault(dialect, Totals()).add(folded)
        for tally in list(self.live.values()):
            out.setdefault(tally.dialect, Totals()).add(tally)
        return out

    def mean_duration_s(self) -> float | None:
        return sum(self.durations) / len(self.durations) if self.durations else None

    def to_json(self, now: float) -> dict[str, Any]:
        totals = self.totals()
        overall = Totals()
        for t in totals.values():
            overall.add(t)
        return {
            "uptime_s": round(now - self.started_at, 3),
            "sessions": {
                "admitted": dict(sorted(self.admitted.items())),
                "rejected": _nested(self.rejected),
                "ended": _nested(self.ended),
                "live": len(self.live),
            },
            "resumes": dict(self.resumes),
            "resume_replay_seconds": self.resume_replay.to_json(),
            "total": overall.to_json(),
            "by_dialect": {d: t.to_json() for d, t in sorted(totals.items())},
            "ended_sessions": list(self.recent),
        }


def _nested(counter: Counter[tuple[str, str]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (outer, inner), n in sorted(counter.items()):
        out.setdefault(outer, {})[inner] = n
    return out
