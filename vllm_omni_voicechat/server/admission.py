"""Session admission: a fixed number of concurrent sessions; the rest are turned away as busy."""

from __future__ import annotations

from collections.abc import Callable


class Slot:
    """One admitted session's place; ``release`` is idempotent, so the session's end frees it once, early (before
    its socket's close handshake), and the connection handler's ``finally`` is only a backstop."""

    __slots__ = ("_admission", "released")

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._admission._release()


class Admission:
    def __init__(self, capacity: int, on_release: Callable[[], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.active = 0
        self.on_release = on_release  # observers (tests, metrics) learn when a slot frees

    def try_acquire(self) -> Slot | None:
        if self.active >= self.capacity:
            return None
        self.active += 1
        return Slot(self)

    def _release(self) -> None:
        if self.active <= 0:
            raise RuntimeError("release without acquire")
        self.active -= 1
        if self.on_release is not None:
            self.on_release()
