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
from array import array
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
        # What is retained lives in three flat buffers, not an object or four per event: a session that never
        # acknowledges retains tens of thousands of small events, and as separate objects they fill allocator arenas
        # that one long-lived object allocated beside them keeps from the OS after the session has ended. Flat
        # buffers are also invisible to the cycle collector. Retained seqs are consecutive (appends stop for good at
        # an overflow), so entry i (from ``_first``) is seq ``_last_seq - len(self) + 1 + i``.
        self._text = bytearray()
        """The retained events' UTF-8, oldest first."""
        self._ends: array[int] = array("q")
        """Each entry's end offset in ``_text`` plus ``_cut`` (the bytes dropped from its front so far)."""
        self._ats: array[float] = array("d")
        self._first = 0
        """Index of the oldest retained entry in ``_ends``/``_ats`` (dropped entries are compacted away in bulk)."""
        self._cut = 0
        self._last_seq = 0

    @property
    def retained_bytes(self) -> int:
        return len(self._text)

    def __len__(self) -> int:
        return len(self._ends) - self._first

    def entries(self) -> tuple[Entry, ...]:
        """What is retained, oldest first."""
        return self._entries_from(self._first)

    def record(self, event: dict[str, Any], now: float, *,
               encode: Callable[[dict[str, Any]], str] = compact_json) -> Recorded:
        """Stamp ``server_event_seq`` on ``event`` and retain it while the bounds allow (``encode``: its JSON)."""
        self.prune(now)
        self.head += 1
        text = encode({**event, "server_event_seq": self.head})
        if self.overflowed:
            return Recorded(text, self.head)
        data = text.encode("utf-8", "surrogatepass")
        if len(self._text) + len(data) > self.max_bytes:
            # Sticky: a resume can no longer be complete, so the client is told once, live, and events flow on.
            self.overflowed = True
            return Recorded(text, self.head, overflow_notice=True)
        self._text += data
        self._ends.append(self._cut + len(self._text))
        self._ats.append(now)
        self._last_seq = self.head
        return Recorded(text, self.head)

    def acknowledge(self, seq: Any) -> None:
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0 or seq > self.head:
            raise InvalidAck(f"event ack {seq!r} is outside 0..{self.head}")
        self._drop(min(len(self), max(0, seq - (self._last_seq - len(self)))))
        self.dropped_through = max(self.dropped_through, seq)

    def prune(self, now: float) -> None:
        ats, first, end = self._ats, self._first, len(self._ats)
        k = first
        while k < end and now - ats[k] > self.ttl_s:
            k += 1
        if k > first:
            self.dropped_through = max(self.dropped_through, self._last_seq - (end - k))
            self._drop(k - first)

    def _drop(self, n: int) -> None:
        """Forget the ``n`` oldest retained entries."""
        if n <= 0:
            return
        self._first += n
        end = self._ends[self._first - 1]
        del self._text[:end - self._cut]  # CPython moves a bytearray's start here, no copy
        self._cut = end
        if self._first == len(self._ends):
            del self._ends[:], self._ats[:]
            self._first = 0
        elif self._first >= 1024 and 2 * self._first >= len(self._ends):
            del self._ends[:self._first], self._ats[:self._first]
            self._first = 0

    def _entries_from(self, index: int) -> tuple[Entry, ...]:
        ends, ats, cut = self._ends, self._ats, self._cut
        seq = self._last_seq - (len(ends) - index) + 1
        out = []
        for k in range(index, len(ends)):
            start = ends[k - 1] - cut if k > self._first else 0
            text = self._text[start:ends[k] - cut].decode("utf-8", "surrogatepass")
            out.append(Entry(seq, ats[k], ends[k] - cut - start, text))
            seq += 1
        return tuple(out)

    def replay_after(self, seq: int, now: float) -> Replay | ResyncRequired | ReplayConflict:
        self.prune(now)
        if seq > self.head:
            return ReplayConflict(self.head)
        if self.overflowed:
            return ResyncRequired("journal_overflow")
        if seq < self.dropped_through:
            return ResyncRequired("journal_gap")
        return Replay(self._entries_from(max(self._first, len(self._ends) - max(0, self._last_seq - seq))))


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
