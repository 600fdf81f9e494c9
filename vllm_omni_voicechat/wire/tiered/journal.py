"""The resume journal and its credential (pure; time is injected).

Every journaled server event gets the next ``server_event_seq``. The journal retains events, bounded in bytes
(compact UTF-8 JSON) and age, until the client acknowledges them (``session.event_ack``); ``session.resume`` replays
everything after the client's cursor, byte-identical and in order, or says why it cannot. Transport-level events
(``session.created``, ``session.resumed``, ``session.replaced``, ``session.resync_required``, handshake errors) are
never journaled and carry no seq: DuplexClient drops any event whose seq is not above the last one it saw.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ...errors import VoicechatError
from ...ids import SYSTEM_IDS, Ids
from ..transport import compact_json

DEFAULT_MAX_BYTES = 8 << 20
DEFAULT_TTL_S = 60.0


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int
    at: float
    size: int
    text: str
    """The event as sent: compact JSON with its ``server_event_seq``."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """What to send for a recorded event: its JSON text, plus a one-time live resync notice on overflow."""

    text: str
    seq: int
    overflow_notice: bool = False


@dataclass(frozen=True, slots=True)
class Replay:
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class ResyncRequired:
    reason: Literal["journal_gap", "journal_overflow"]


@dataclass(frozen=True, slots=True)
class ReplayConflict:
    """The client claims events the server never sent (cursor beyond the head)."""

    head: int


class InvalidAck(VoicechatError, ValueError):
    code = "invalid_event_ack"


class Journal:
    def __init__(self, *, max_bytes: int = DEFAULT_MAX_BYTES, ttl_s: float = DEFAULT_TTL_S) -> None:
        if max_bytes < 1 or ttl_s <= 0:
            raise ValueError("journal bounds must be positive")
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.head = 0
        """The last seq stamped (0 before any event)."""
        self.dropped_through = 0
        """Every seq at or below this is gone (acknowledged or aged out)."""
        self.overflowed = False
        # Plain (seq, at, size, text) tuples, not Entry records: a tuple of atoms drops out of the cycle collector's
        # sight, so the thousands retained per session do not lengthen every full collection (~0.5 µs an object).
        self._entries: deque[tuple[int, float, int, str]] = deque()
        self._bytes = 0

    @property
    def retained_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> tuple[Entry, ...]:
        """What is retained, oldest first."""
        return tuple(Entry(*e) for e in self._entries)

    def record(self, event: dict[str, Any], now: float, *,
               encode: Callable[[dict[str, Any]], str] = compact_json) -> Recorded:
        """Stamp ``server_event_seq`` on ``event`` and retain it while the bounds allow (``encode``: its JSON)."""
        self.prune(now)
        self.head += 1
        text = encode({**event, "server_event_seq": self.head})
        if self.overflowed:
            return Recorded(text, self.head)
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))  # isascii: O(1)
        if self._bytes + size > self.max_bytes:
            # Sticky: a resume can no longer be complete, so the client is told once, live, and events flow on.
            self.overflowed = True
            return Recorded(text, self.head, overflow_notice=True)
        self._entries.append((self.head, now, size, text))
        self._bytes += size
        return Recorded(text, self.head)

    def acknowledge(self, seq: Any) -> None:
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0 or seq > self.head:
            raise InvalidAck(f"event ack {seq!r} is outside 0..{self.head}")
        while self._entries and self._entries[0][0] <= seq:
            self._bytes -= self._entries.popleft()[2]
        self.dropped_through = max(self.dropped_through, seq)

    def prune(self, now: float) -> None:
        while self._entries and now - self._entries[0][1] > self.ttl_s:
            seq, _, size, _ = self._entries.popleft()
            self._bytes -= size
            self.dropped_through = max(self.dropped_through, seq)

    def replay_after(self, seq: int, now: float) -> Replay | ResyncRequired | ReplayConflict:
        self.prune(now)
        if seq > self.head:
            return ReplayConflict(self.head)
        if self.overflowed:
            return ResyncRequired("journal_overflow")
        if seq < self.dropped_through:
            return ResyncRequired("journal_gap")
        return Replay(tuple(Entry(*e) for e in self._entries if e[0] > seq))


class ResumeCredential:
    """A rotating resume token; only its SHA-256 digest is kept, compared in constant time."""

    def __init__(self, ids: Ids = SYSTEM_IDS) -> None:
        self._ids = ids
        self.generation = 0
        self._digest = b""
        self._previous: tuple[bytes, int] | None = None

    @staticmethod
    def _hash(token: str) -> bytes:
        return hashlib.sha256(token.encode()).digest()

    def issue(self) -> str:
        """A fresh token for a new attachment (generation 1 at open, +1 per resume)."""
        token = "rt_" + self._ids.token(32)
        self._previous = (self._digest, self.generation)
        self._digest = self._hash(token)
        self.generation += 1
        return token

    def verify(self, token: Any) -> bool:
        if not isinstance(token, str) or not self._digest:
            return False
        try:
            digest = self._hash(token)
        except UnicodeEncodeError:  # e.g. a lone surrogate from JSON: never a token of ours
            return False
        return hmac.compare_digest(digest, self._digest)

    def rollback(self) -> None:
        """Undo the last :meth:`issue` (an activation that failed mid-send): the old token is valid again."""
        if self._previous is not None:
            self._digest, self.generation = self._previous
            self._previous = None
