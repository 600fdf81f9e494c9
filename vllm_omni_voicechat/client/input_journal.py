"""The client's journal of the audio appends it sent (pure): after a tiered session resumes, which of them the session
had not taken in, to send again, once and in order (docs/tiered-dialect.md §6.5).

The server's ``session.resumed`` carries ``input_received``: ``last_append_event_id`` (the last append it handled,
taken in or answered with an error) and ``audio_bytes`` (the audio it took in, over the session's life). The journal
answers with the appends after that event id, or, for appends sent without ids, after that many bytes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import VoicechatError

DEFAULT_MAX_BYTES = 4 << 20
"""Audio retained for resending: ~2 min of 16 kHz PCM16, far more than a socket holds in flight at a drop."""


@dataclass(frozen=True, slots=True)
class SentAppend:
    event_id: str | None
    size: int
    """Audio bytes (decoded)."""
    text: str
    """The event as it was sent (sent again byte for byte)."""
    offset: int
    """Audio bytes recorded before this append."""


class InputGap(VoicechatError):
    """The session lacks audio the journal no longer holds (or never recorded): it cannot be sent again."""


def base64_size(text: str) -> int:
    """The decoded size of standard padded base64 text."""
    return len(text) * 3 // 4 - (2 if text.endswith("==") else 1 if text.endswith("=") else 0)


class InputJournal:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = max_bytes
        self.recorded_bytes = 0
        self._entries: deque[SentAppend] = deque()
        self._retained = 0
        self._index: dict[str, SentAppend] = {}
        self._confirmed: SentAppend | None = None  # the last append a receipt named (a later drop may name it again)

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, event_id: str | None, size: int, text: str) -> None:
        """An append as it goes out; the oldest beyond ``max_bytes`` are forgotten (the newest is always kept)."""
        entry = SentAppend(event_id, size, text, self.recorded_bytes)
        self._entries.append(entry)
        if event_id is not None:
            self._index[event_id] = entry
        self.recorded_bytes += size
        self._retained += size
        while self._retained > self.max_bytes and len(self._entries) > 1:
            self._forget(self._entries.popleft())

    def _forget(self, entry: SentAppend) -> None:
        self._retained -= entry.size
        if entry.event_id is not None and self._index.get(entry.event_id) is entry:
            del self._index[entry.event_id]

    def unreceived(self, receipt: Mapping[str, Any]) -> list[SentAppend]:
        """What to send again, in order, given ``session.resumed.input_received``; what the session has is forgotten.

        Raises :class:`InputGap` when the receipt points before what the journal retains, or at an append it never
        recorded."""
        last = receipt.get("last_append_event_id")
        if isinstance(last, str):
            entry = self._index.get(last)
            if entry is None and self._confirmed is not None and self._confirmed.event_id == last:
                entry = self._confirmed
            if entry is None:
                raise InputGap(f"append {last!r} is not in the journal")
            self._confirmed = entry
            while self._entries and self._entries[0].offset <= entry.offset:
                self._forget(self._entries.popleft())
            return list(self._entries)
        taken = receipt.get("audio_bytes")
        if isinstance(taken, bool) or not isinstance(taken, int) or taken < 0:
            raise InputGap(f"input_received has no usable position: {dict(receipt)!r}")
        first = self._entries[0].offset if self._entries else self.recorded_bytes
        if taken < first or taken > self.recorded_bytes:
            raise InputGap(f"the session has {taken} bytes; the journal holds {first}..{self.recorded_bytes}")
        while self._entries and self._entries[0].offset < taken:
            head = self._entries[0]
            if head.offset + head.size > taken:
                raise InputGap(f"the session's {taken} bytes end inside an append ({head.offset}+{head.size})")
            self._forget(self._entries.popleft())
        return list(self._entries)
