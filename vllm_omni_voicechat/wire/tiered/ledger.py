"""The playback ledger of one wire response (pure).

Tracks how much of a response's audio was generated, sent, played and may be committed to history, in integer
milliseconds. Client acks and truncations are clamped to what was actually sent (0 and overshoot are accepted,
never an error); everything is monotone except an explicit truncation.
"""

from __future__ import annotations

import math
import sys
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Literal

Policy = Literal["commit_all_on_done", "ack_only"]


@dataclass(frozen=True, slots=True)
class AudioTextMark:
    """After an audio delta: the transcript length so far and the audio sent so far."""

    text_chars: int
    audio_end_ms: int


def _ms(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:  # NaN
        return 0
    if isinstance(value, float) and math.isinf(value):
        return sys.maxsize if value > 0 else -sys.maxsize  # clamped like any overshoot
    return int(value)


@dataclass(slots=True)
class PlaybackLedger:
    response_id: str
    policy: Policy = "commit_all_on_done"
    generated_ms: int = 0
    sent_ms: int = 0
    played_ms: int = 0
    committed_ms: int = 0
    hard_cap: int | None = None
    """Set by a truncation: history never again extends past it."""
    done: bool = False
    # The marks as two lists of ints, not AudioTextMark records: no object per audio delta for the cycle collector
    # to walk in every full collection (a session keeps its responses' ledgers).
    _mark_chars: list[int] = field(default_factory=list, init=False, repr=False)
    _mark_ends: list[int] = field(default_factory=list, init=False, repr=False)

    @property
    def marks(self) -> list[AudioTextMark]:
        """After each audio delta sent: the transcript length and the audio sent so far."""
        return [AudioTextMark(c, e) for c, e in zip(self._mark_chars, self._mark_ends)]

    # --- production side ------------------------------------------------------------------------------------

    def generated(self, ms: int) -> None:
        self.generated_ms += ms

    def sent(self, ms: int, transcript_chars: int) -> None:
        self.sent_ms += ms
        self._mark_chars.append(transcript_chars)
        self._mark_ends.append(self.sent_ms)

    def finish(self, completed: bool) -> None:
        """The response ended: ``commit_all_on_done`` commits everything sent (up to a truncation cap)."""
        self.done = True
        if completed and self.policy == "commit_all_on_done":
            self.committed_ms = self._capped(self.sent_ms)

    # --- client side ----------------------------------------------------------------------------------------

    def clamp(self, value: Any) -> int:
        return min(max(_ms(value), 0), self.sent_ms)

    def ack(self, played_ms: Any, committed_ms: Any = None, *, truncate: bool = False) -> None:
        self.played_ms = max(self.played_ms, self.clamp(played_ms))
        c = self.clamp(played_ms if committed_ms is None else committed_ms)
        if truncate:
            self.hard_cap = c if self.hard_cap is None else min(self.hard_cap, c)
            self.committed_ms = self.hard_cap  # may go backwards; never past an earlier truncation
        else:
            self.committed_ms = self._capped(max(self.committed_ms, c))

    def truncate(self, audio_end_ms: Any) -> int:
        """``conversation.item.truncate``: a truncating ack; returns the clamped end actually applied."""
        self.ack(self.played_ms, self.clamp(audio_end_ms), truncate=True)
        return self.committed_ms  # an earlier, shorter truncation still holds

    def _capped(self, value: int) -> int:
        return value if self.hard_cap is None else min(value, self.hard_cap)

    # --- history --------------------------------------------------------------------------------------------

    def text_chars_at(self, ms: int) -> int:
        """Transcript characters heard by ``ms``: the last mark whose audio ended by then (exact to a position)."""
        i = bisect_right(self._mark_ends, ms)  # the ends never decrease (sent_ms only grows)
        return self._mark_chars[i - 1] if i else 0

    @property
    def unplayed(self) -> bool:
        return self.sent_ms > self.committed_ms

    def snapshot(self) -> dict[str, int]:
        return {
            "generated_ms": self.generated_ms,
            "sent_ms": self.sent_ms,
            "played_ms": self.played_ms,
            "committed_ms": self.committed_ms,
        }
