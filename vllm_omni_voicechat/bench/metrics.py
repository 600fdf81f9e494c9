"""Per-turn latency from a timestamped event trace: a pure state machine fed ``(t, sent, event)`` in order.

It knows both dialects' names for the few events it times (they share most of them): the client's
``input_audio_buffer.commit`` starts the clock, then ``input_audio_buffer.committed``, ``response.created``, the
first text delta, every audio delta and ``response.done`` of that turn's response. Strict v3 adds
``voicechat.metrics`` (one per model position, ``over_budget`` when the step took longer than its 80 ms budget);
the tiered dialect reports no per-position telemetry, so its over-budget fields stay ``None`` (not measured), never
0. Times are seconds on whatever clock the caller used; results are milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

AUDIO_DELTA_TYPES = frozenset({"response.output_audio.delta", "response.audio.delta"})
TEXT_DELTA_TYPES = frozenset(
    {"response.output_text.delta", "response.output_audio_transcript.delta", "response.audio_transcript.delta"}
)
# The 80 ms-budget telemetry of strict v3; None of these exist on the tiered dialect.
POSITION_METRICS_TYPE = "voicechat.metrics"
DEFAULT_OUTPUT_RATE = {"v3": 22_050, "tiered": 24_000}

# The timed intervals of a turn, in report order (all milliseconds).
LATENCY_FIELDS = (
    "commit_to_committed_ms",
    "commit_to_response_created_ms",
    "ttft_ms",
    "ttfa_ms",
    "audio_span_ms",
)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) with linear interpolation between ranks (numpy's default); None if empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def decoded_len(b64: str) -> int:
    """Bytes a standard base64 string decodes to, without decoding it."""
    n = len(b64)
    if n == 0:
        return 0
    return n * 3 // 4 - (b64.endswith("=")) - (b64.endswith("=="))


def _response_id(event: dict) -> str | None:
    rid = event.get("response_id")
    if rid is None and isinstance(event.get("response"), dict):
        rid = event["response"].get("id")
    return rid


def _output_rate(event: dict) -> int | None:
    """The output rate a ``session.created``/``session.updated`` announces (v3 flat field, tiered nested)."""
    s = event.get("session")
    if not isinstance(s, dict):
        return None
    rate = s.get("output_audio_sample_rate")
    if rate is None:
        out = (s.get("audio") or {}).get("output") or {}
        fmt = out.get("format") or {}
        rate = out.get("sample_rate_hz") or (fmt.get("rate") if isinstance(fmt, dict) else None)
    return int(rate) if isinstance(rate, int | float) and rate > 0 else None


def _ms(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else (b - a) * 1000.0


@dataclass
class TurnRecord:
    """One user turn: what was measured (milliseconds) and what went wrong."""

    index: int
    commit_to_committed_ms: float | None = None
    commit_to_response_created_ms: float | None = None
    ttft_ms: float | None = None
    ttfa_ms: float | None = None
    audio_span_ms: float | None = None
    gap_p50_ms: float | None = None
    gap_p99_ms: float | None = None
    gap_max_ms: float | None = None
    audio_ms: float = 0.0
    audio_rtf: float | None = None
    audio_deltas: int = 0
    text_deltas: int = 0
    input_frames: int = 0
    text: str = ""
    response_id: str | None = None
    status: str | None = None
    positions: int | None = None  # model positions reported (voicechat.metrics); None: dialect reports none
    over_budget_positions: list[int] | None = None
    errors: list[str] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "completed" and not self.errors

    def to_json(self, *, with_gaps: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_gaps:
            d.pop("gaps_ms")
        return d


@dataclass
class _Open:
    index: int
    started: float
    input_frames: int = 0
    commit: float | None = None
    committed: float | None = None
    created: float | None = None
    response_id: str | None = None
    first_text: float | None = None
    text_times: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    audio_times: list[float] = field(default_factory=list)
    audio_samples: int = 0
    audio_rate: int = 0
    positions: int = 0
    over_budget: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class TurnMeter:
    """Feed every event of one socket, in order, with its timestamp; read ``turns`` (closed turns) and ``errors``.

    A turn opens with the client's first audio/turn event after the previous turn closed, is timed from its
    ``commit`` and closes on ``response.done`` of the response created after that commit (or on ``finish``,
    incomplete). Events of no open turn are ignored, except errors: those land in ``errors``.
    """

    def __init__(self, dialect: str) -> None:
        if dialect not in DEFAULT_OUTPUT_RATE:
            raise ValueError(f"dialect must be one of {sorted(DEFAULT_OUTPUT_RATE)}, got {dialect!r}")
        self.dialect = dialect
        self.reports_positions = dialect == "v3"
        self.output_rate = DEFAULT_OUTPUT_RATE[dialect]
        self.turns: list[TurnRecord] = []
        self.errors: list[str] = []
        self._open: _Open | None = None
        self._last_t: float | None = None

    def feed(self, t: float, sent: bool, event: dict) -> None:
        if self._last_t is not None and t < self._last_t:
            raise ValueError(f"timestamps must not go backwards ({t} < {self._last_t})")
        self._last_t = t
        kind = event.get("type")
        if sent:
            self._client(t, kind, event)
        else:
            self._server(t, kind, event)

    def finish(self, reason: str = "session ended before response.done") -> list[TurnRecord]:
        """Close a turn still open (it counts as an error) and return all turns."""
        if self._open is not None and (self._open.commit is not None or self._open.input_frames):
            self._open.errors.append(reason)
            self._close(None)
        self._open = None
        return self.turns

    # ---------------------------------------------------------------------------------------------------- client

    def _turn(self, t: float) -> _Open:
        if self._open is None:
            self._open = _Open(index=len(self.turns), started=t, audio_rate=self.output_rate)
        return self._open

    def _client(self, t: float, kind: str | None, event: dict) -> None:
        if kind == "input_audio_buffer.append":
            turn = self._turn(t)
            if turn.commit is None:  # audio after the commit belongs to no turn's input (full-duplex listening)
                turn.input_frames += int(event.get("frames", 1))
        elif kind == "input_audio_buffer.turn_start":
            self._turn(t)
        elif kind == "input_audio_buffer.commit":
            turn = self._turn(t)
            if turn.commit is None:
                turn.commit = t

    # ---------------------------------------------------------------------------------------------------- server

    def _server(self, t: float, kind: str | None, event: dict) -> None:
        turn = self._open
        if kind in ("session.created", "session.updated"):
            rate = _output_rate(event)
            if rate:
                self.output_rate = rate
                if turn is not None:
                    turn.audio_rate = rate
            return
        if kind == POSITION_METRICS_TYPE:
            if turn is not None and event.get("frame") is not None:
                turn.positions += 1
                if event.get("over_budget"):
                    turn.over_budget.append(int(event["frame"]))
            return
        if kind == "error":
            err = event.get("error")
            code = err.get("code") if isinstance(err, dict) else event.get("code")
            msg = f"error {code}: {err.get('message') if isinstance(err, dict) else err}"
            (turn.errors if turn is not None else self.errors).append(msg)
            return
        if turn is None or turn.commit is None:
            return
        rid = _response_id(event)
        if kind == "input_audio_buffer.committed":
            if turn.committed is None:
                turn.committed = t
        elif kind == "response.created":
            if turn.created is None:
                turn.created, turn.response_id = t, rid
        elif turn.created is None or rid != turn.response_id:
            return  # another response's events (e.g. one still cancelling)
        elif kind in AUDIO_DELTA_TYPES:
            n = event["audio_bytes"] if "audio_bytes" in event else decoded_len(event.get("delta") or "")
            turn.audio_times.append(t)
            turn.audio_samples += n // 2
            rate = event.get("sample_rate") or event.get("sample_rate_hz")
            if isinstance(rate, int) and rate > 0:
                turn.audio_rate = rate
        elif kind in TEXT_DELTA_TYPES:
            turn.text_times.append(t)
            turn.text.append(str(event.get("delta") or ""))
        elif kind == "response.done":
            status = event.get("status")
            if status is None and isinstance(event.get("response"), dict):
                status = event["response"].get("status")
            if status != "completed":
                turn.errors.append(f"response {rid} ended {status}")
            self._close(status)

    def _close(self, status: str | None) -> None:
        o = self._open
        assert o is not None
        self._open = None
        gaps = [(b - a) * 1000.0 for a, b in zip(o.audio_times, o.audio_times[1:])]
        audio_ms = o.audio_samples * 1000.0 / o.audio_rate if o.audio_rate else 0.0
        first_audio = o.audio_times[0] if o.audio_times else None
        last_audio = o.audio_times[-1] if o.audio_times else None
        gen_ms = _ms(o.created, last_audio)
        rec = TurnRecord(
            index=o.index,
            commit_to_committed_ms=_ms(o.commit, o.committed),
            commit_to_response_created_ms=_ms(o.commit, o.created),
            ttft_ms=_ms(o.commit, o.text_times[0] if o.text_times else None),
            ttfa_ms=_ms(o.commit, first_audio),
            audio_span_ms=_ms(first_audio, last_audio),
            gap_p50_ms=percentile(gaps, 50),
            gap_p99_ms=percentile(gaps, 99),
            gap_max_ms=max(gaps) if gaps else None,
            audio_ms=audio_ms,
            # vLLM-Omni's request RTF: response.created to last audio packet over emitted audio duration
            audio_rtf=gen_ms / audio_ms if gen_ms is not None and audio_ms > 0 else None,
            audio_deltas=len(o.audio_times),
            text_deltas=len(o.text_times),
            input_frames=o.input_frames,
            text="".join(o.text),
            response_id=o.response_id,
            status=status,
            positions=o.positions if self.reports_positions else None,
            over_budget_positions=list(o.over_budget) if self.reports_positions else None,
            errors=list(o.errors),
            gaps_ms=gaps,
        )
        if o.commit is None:
            rec.errors.append("turn never committed")
        self.turns.append(rec)


def measure(dialect: str, trace: Iterable[tuple[float, bool, dict]]) -> tuple[list[TurnRecord], list[str]]:
    """All turns of one socket's trace and its stray errors (the functional form of ``TurnMeter``)."""
    meter = TurnMeter(dialect)
    for t, sent, event in trace:
        meter.feed(t, sent, event)
    return meter.finish(), meter.errors


def _dist(values: Sequence[float]) -> dict[str, float | int | None]:
    return {
        "count": len(values),
        "mean": sum(values) / len(values) if values else None,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values) if values else None,
    }


def summarize(turns: Sequence[TurnRecord], *, sessions: int, failed_sessions: int = 0,
              session_errors: Sequence[str] = (), duration_s: float | None = None) -> dict[str, Any]:
    """Run-level aggregate over every turn of every session: distributions (ms) plus counts."""
    out: dict[str, Any] = {
        "sessions": sessions,
        "failed_sessions": failed_sessions,
        "turns": len(turns),
        "completed_turns": sum(1 for r in turns if r.ok),
    }
    for name in LATENCY_FIELDS:
        out[name] = _dist([v for r in turns if (v := getattr(r, name)) is not None])
    gaps = [g for r in turns for g in r.gaps_ms]
    out["inter_delta_gap_ms"] = _dist(gaps)
    out["audio_rtf"] = _dist([r.audio_rtf for r in turns if r.audio_rtf is not None])
    out["audio_ms_total"] = sum(r.audio_ms for r in turns)
    measured = [r for r in turns if r.over_budget_positions is not None]
    out["positions"] = sum(r.positions or 0 for r in measured) if measured else None
    out["over_budget_positions"] = (sum(len(r.over_budget_positions or ()) for r in measured)
                                    if measured else None)
    errors = [e for r in turns for e in r.errors] + list(session_errors)
    out["errors"] = len(errors)
    out["error_messages"] = sorted(set(errors))[:50]
    if duration_s is not None:
        out["duration_s"] = duration_s
    return out


__all__ = ["LATENCY_FIELDS", "TurnMeter", "TurnRecord", "decoded_len", "measure", "percentile", "summarize"]
