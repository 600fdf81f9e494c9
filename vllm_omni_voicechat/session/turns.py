"""Client-owned turn barriers: the open turn, idempotent re-acks for remembered ids, and conflicts."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

REMEMBERED_TURN_IDS = 16


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with a barrier: run it, re-ack it, or fail the session."""

    action: Literal["run", "reack", "conflict"]
    turn_id: str | None = None
    message: str = ""
    details: dict | None = None


class _Remembered:
    """The last N client turn ids with their server turn ids (oldest forgotten first)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._ids: OrderedDict[int, str] = OrderedDict()

    def add(self, client_turn_id: int, turn_id: str) -> None:
        self._ids[client_turn_id] = turn_id
        self._ids.move_to_end(client_turn_id)
        while len(self._ids) > self._size:
            self._ids.popitem(last=False)

    def get(self, client_turn_id: int) -> str | None:
        return self._ids.get(client_turn_id)

    def __len__(self) -> int:
        return len(self._ids)


class TurnLedger:
    """Evaluates ``turn_start`` / ``commit`` at receipt, in the contract's order (shape is checked by the parser)."""

    def __init__(self, remembered: int = REMEMBERED_TURN_IDS) -> None:
        self.open_client_turn_id: int | None = None
        self.open_turn_id: str | None = None
        self._started = _Remembered(remembered)
        self._committed = _Remembered(remembered)

    def check_start(self, client_turn_id: int, *, typed_active: bool) -> Verdict:
        known = self._started.get(client_turn_id)
        if known is not None:
            return Verdict("reack", known)
        if self.open_client_turn_id is not None:
            return Verdict(
                "conflict",
                message=f"turn_start {client_turn_id} while client turn {self.open_client_turn_id} is open",
                details={"client_turn_id": client_turn_id, "open_client_turn_id": self.open_client_turn_id},
            )
        if typed_active:
            return Verdict(
                "conflict",
                message=f"turn_start {client_turn_id} while a typed input job is active",
                details={"client_turn_id": client_turn_id},
            )
        return Verdict("run")

    def start(self, client_turn_id: int, turn_id: str) -> None:
        self.open_client_turn_id = client_turn_id
        self.open_turn_id = turn_id
        self._started.add(client_turn_id, turn_id)

    def check_commit(self, client_turn_id: int) -> Verdict:
        known = self._committed.get(client_turn_id)
        if known is not None:
            return Verdict("reack", known)
        if self.open_client_turn_id is None:
            return Verdict(
                "conflict",
                message=f"commit {client_turn_id} without an open client turn",
                details={"client_turn_id": client_turn_id, "open_client_turn_id": None},
            )
        if client_turn_id != self.open_client_turn_id:
            return Verdict(
                "conflict",
                message=f"commit {client_turn_id} does not match open client turn {self.open_client_turn_id}",
                details={"client_turn_id": client_turn_id, "open_client_turn_id": self.open_client_turn_id},
            )
        return Verdict("run", self.open_turn_id)

    def commit(self, client_turn_id: int) -> str:
        turn_id = self.open_turn_id
        assert turn_id is not None and client_turn_id == self.open_client_turn_id
        self._committed.add(client_turn_id, turn_id)
        self.open_client_turn_id = None
        self.open_turn_id = None
        return turn_id

    @property
    def turn_open(self) -> bool:
        return self.open_client_turn_id is not None

    @property
    def started_any(self) -> bool:
        """A client turn was ever started (it locks the session's settings)."""
        return len(self._started) > 0
