"""Session admission: a fixed number of concurrent sessions; the rest are turned away as busy."""

from __future__ import annotations


class Admission:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.active = 0

    def try_acquire(self) -> bool:
        if self.active >= self.capacity:
            return False
        self.active += 1
        return True

    def release(self) -> None:
        if self.active <= 0:
            raise RuntimeError("release without acquire")
        self.active -= 1
