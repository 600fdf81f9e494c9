"""Session admission: a fixed number of concurrent sessions; the rest are turned away as busy."""

from __future__ import annotations

from collections.abc import Callable


class Admission:
    def __init__(self, capacity: int, on_release: Callable[[], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.active = 0
        self.on_release = on_release  # observers (tests, metrics) learn when a slot frees

    def try_acquire(self) -> bool:
        if self.active >= self.capacity:
            return False
        self.active += 1
        return True

    def release(self) -> None:
        if self.active <= 0:
            raise RuntimeError("release without acquire")
        self.active -= 1
        if self.on_release is not None:
            self.on_release()
