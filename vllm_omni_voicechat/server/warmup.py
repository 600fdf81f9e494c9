"""Warmup before admitting clients: a throwaway session of a few silent model positions.

The first positions of a model home pay one-time costs (allocations, kernel compilation, caches); running them on
a session nobody waits for keeps them off the first client's latency path. The server runs it in its startup
hook, so no connection is accepted before it finished.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..audio.frames import SILENT_INPUT_FRAME
from ..model.port import ModelPort, PositionInput, SessionPrompt


@dataclass(frozen=True, slots=True)
class WarmupReport:
    positions: int
    seconds: float


def warm_up(model: ModelPort, positions: int, *, clock=time.perf_counter) -> WarmupReport:
    """Prefill an empty prompt, run ``positions`` silent positions, release the model (also on failure)."""
    start = clock()
    try:
        model.prefill(SessionPrompt(""))
        for _ in range(positions):
            model.step(PositionInput(SILENT_INPUT_FRAME, synthetic=True))
    finally:
        model.abort()
    return WarmupReport(positions, round(clock() - start, 6))
