"""Warmup before admitting clients: a throwaway session of a few silent model positions.

The first positions of a model home pay one-time costs (allocations, kernel compilation, caches); running them on
a session nobody waits for keeps them off the first client's latency path. The server runs it in its startup
hook, so no connection is accepted before it finished. It also measures what one position costs on this model home
(``step_ms``: submit -> the position's audio; ``inference_ms``: submit -> the model's token, where the port reports
it) for the operator choosing the audio lag and the step timeout. A failure is reported, never raised: the server
starts degraded (``/health`` says so) instead of not at all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..audio.frames import SILENT_INPUT_FRAME
from ..model.port import ModelPort, PositionInput, SessionPrompt


@dataclass(frozen=True, slots=True)
class WarmupReport:
    positions: int
    seconds: float
    error: str | None = None
    step_ms: tuple[float, ...] = field(default=())
    inference_ms: tuple[float, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"positions": self.positions, "seconds": self.seconds, "ok": self.error is None,
                               "step_ms": list(self.step_ms), "inference_ms": list(self.inference_ms)}
        if self.error is not None:
            out["error"] = self.error
        return out


def warm_up(model: ModelPort, positions: int, *, clock=time.perf_counter) -> WarmupReport:
    """Prefill an empty prompt, run ``positions`` silent positions, release the model (also on failure). A failure
    is in the report (``error``, ``positions`` = the positions that ran)."""
    start = clock()
    steps: list[float] = []
    inference: list[float] = []
    error: str | None = None
    try:
        model.prefill(SessionPrompt(""))
        for _ in range(positions):
            t0 = clock()
            result = model.step(PositionInput(SILENT_INPUT_FRAME, synthetic=True))
            steps.append(round((clock() - t0) * 1000.0, 3))
            ms = getattr(getattr(result, "timings", None), "inference_ms", None)
            if ms is not None:
                inference.append(round(float(ms), 3))
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            model.abort()
        except Exception as exc:
            error = error or f"abort failed: {type(exc).__name__}: {exc}"
    return WarmupReport(len(steps), round(clock() - start, 6), error, tuple(steps), tuple(inference))
