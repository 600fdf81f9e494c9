"""Clocks injected into drivers: the session core itself only ever sees ``now`` values."""

from __future__ import annotations


class VirtualClock:
    """A manual monotonic clock (seconds)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self.now += seconds
        return self.now

    def advance_to(self, t: float) -> float:
        self.now = max(self.now, t)
        return self.now
