"""The epoch fence (pure): cancelling a response advances the epoch and fences the response, so nothing of it
reaches the client after its cancelled terminal — even the positions still in flight or draining."""

from __future__ import annotations

from typing import Any


class EpochFence:
    def __init__(self) -> None:
        self.epoch = 0
        self._fenced: set[str] = set()

    def advance(self, response_id: str | None = None) -> int:
        """Start the next epoch; ``response_id`` (a native response id) is fenced from now on."""
        if response_id is not None:
            self._fenced.add(response_id)
        self.epoch += 1
        return self.epoch

    def fenced(self, response_id: str | None) -> bool:
        return response_id is not None and response_id in self._fenced

    def admits(self, event: Any) -> bool:
        """False for a native event that belongs to a fenced response."""
        return not self.fenced(getattr(event, "response_id", None))
