"""The engine tick: the positions of concurrent sessions released to one engine together.

One engine serves many sessions, and a forward pass costs about the same for one position as for many (a decode
reads every weight once, whatever the batch). So positions are released in ticks: a tick opens with the first
position that joins it and is released as soon as every session expected within its slot has joined, or when the
slot ends, whichever comes first. A session is expected at its last position's ready time plus one frame (a
client streaming in real time sends the next frame then); a tick waits only for sessions expected before its slot
ends. Sessions whose frames arrive within a slot of each other therefore share every tick; a lone session, a
session catching up on a backlog that nobody else is due to join, or the first tick after a quiet spell is
released at once. A session that was expected and did not come is not waited for again until it joins a tick.

The slot is at most half a frame: waiting longer could pair a position with another session's next frame rather
than its current one (a hold of nearly a frame where a few milliseconds would do). 0 releases every position at
once (no batching).

The slot runs from when the tick opened (its first member joined), so positions that queued behind a busy engine
still share a forward. The hold is policy, not lateness. Each release says when the policy meant to release it (``due``: when every
member's position was ready, capped at the slot), so a host can tell the wait it chose (``held_ms``: joined ->
released, at most the slot) from positions that queued because the engine fell behind (``late_ms``: released
after the later of ``due`` and the member's own ready time, both counted from when its audio reached the host if
that was earlier, and ``due`` capped at a slot after it).

Pure: no clock and no threads; every method takes ``now`` (seconds on one monotonic timeline). The engine's host
(``omni/batching.py``) blocks each session's position until its tick is released and submits the tick's positions
together.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable

from ..audio.frames import FRAME_SECONDS
from ..errors import StateError
from ..records import record


class ReleaseReason(str, enum.Enum):
    COMPLETE = "complete"
    """Every session expected within the slot joined it."""
    SLOT = "slot"
    """The slot ended before every expected session joined."""


@record
class Member:
    """One session's position in a tick."""

    key: Hashable
    ready: float
    """When the position could have run (its frame arrived, its pacing allowed it)."""
    joined: float
    """When it joined the tick (later than ``ready`` when its session's previous position was still running)."""
    arrived: float | None = None
    """When its audio reached the host, if before ``ready`` (the host handed it over only after the session's
    position in flight): lateness counts from then. None: ``ready``."""

    @property
    def late_from(self) -> float:
        return self.ready if self.arrived is None else min(self.arrived, self.ready)


@record
class Release:
    """A released tick: its positions go to the engine together."""

    tick: int
    members: tuple[Member, ...]
    """In the order they joined."""
    at: float
    due: float
    """When the policy meant to release it: when the last member's position was ready, or the slot's end when the
    tick waited it out for a session that did not come."""
    reason: ReleaseReason
    slot: float
    """The policy's longest hold (seconds)."""

    @property
    def size(self) -> int:
        return len(self.members)

    def held_ms(self, member: Member) -> float:
        """The wait the tick chose for ``member``: joined -> released (at most the slot)."""
        return max(0.0, self.at - member.joined) * 1000.0

    def late_ms(self, member: Member) -> float:
        """How far past its own due ``member`` was released: the engine, not the policy, held it up. Its due is the
        tick's, but never more than a slot after its own position was ready: a position that queued behind its
        session's previous one is late by that wait even when it shares a tick with sessions that are on time."""
        since = member.late_from
        due = min(self.due, since + self.slot)
        return max(0.0, self.at - max(since, due)) * 1000.0


class EngineTick:
    """The tick policy of one engine (see the module docstring)."""

    def __init__(self, slot_s: float, *, period_s: float = FRAME_SECONDS) -> None:
        if not 0.0 <= slot_s <= period_s / 2:
            raise ValueError(f"a tick slot is 0 to half a frame ({period_s / 2:g} s), got {slot_s!r}")
        self.slot_s = slot_s
        self.period_s = period_s
        self.ticks = 0
        """Ticks released so far; the open tick's number."""
        self._live: set[Hashable] = set()
        self._open: dict[Hashable, Member] = {}
        self._next: dict[Hashable, float] = {}
        """When each session's next position is expected (a frame after its last one was ready)."""

    # --- sessions -------------------------------------------------------------------------------------------

    def enter(self, key: Hashable) -> None:
        """A session that will submit positions (its engine session is open)."""
        if key in self._live:
            raise StateError(f"session {key!r} entered the tick twice")
        self._live.add(key)

    def leave(self, key: Hashable, now: float) -> Release | None:
        """A session ended: it is no longer expected (which may complete the open tick). It must hold no position."""
        if key in self._open:
            raise StateError(f"session {key!r} left while its position is held")
        self._live.discard(key)
        self._next.pop(key, None)
        return self._release_if_complete(now)

    @property
    def live(self) -> int:
        return len(self._live)

    # --- positions ------------------------------------------------------------------------------------------

    def join(self, key: Hashable, ready: float, now: float, *, arrived: float | None = None) -> Release | None:
        """``key``'s next position joins the open tick (opening one if none is); the release when this completes it
        or its slot has already ended. ``arrived``: when its audio reached the host, if before ``ready`` (lateness
        only: the policy paces sessions by ``ready``)."""
        if key not in self._live:
            raise StateError(f"session {key!r} joined the tick without entering it")
        if key in self._open:
            raise StateError(f"session {key!r} already holds a position in tick {self.ticks}")
        self._open[key] = Member(key, min(ready, now), now, arrived)
        if now >= self._slot_end():  # joined after its slot ended: nothing was held for the policy
            return self._release(now, ReleaseReason.SLOT, self._all_ready())
        return self._release_if_complete(now)

    @property
    def deadline(self) -> float | None:
        """When the open tick is released whoever is missing (None: no tick is open)."""
        return self._slot_end() if self._open else None

    @property
    def waiting_for(self) -> frozenset[Hashable]:
        """The sessions the open tick still waits for."""
        if not self._open:
            return frozenset()
        end = self._slot_end()
        return frozenset(k for k, at in self._next.items() if at <= end and k not in self._open)

    def poll(self, now: float) -> Release | None:
        """The open tick's release once its slot has ended."""
        if self._open and now >= self._slot_end():
            return self._release(now, ReleaseReason.SLOT, self._slot_end())
        return None

    # --- internals ------------------------------------------------------------------------------------------

    def _slot_end(self) -> float:
        # From when the tick opened, not from its members' ready times: positions that queued behind a busy engine
        # (ready long ago) still wait for each other, which is when sharing a forward matters most.
        return min(m.joined for m in self._open.values()) + self.slot_s

    def _all_ready(self) -> float:
        """When every member's position was ready (within the slot): the policy's release had each joined then."""
        return min(self._slot_end(), max(m.ready for m in self._open.values()))

    def _release_if_complete(self, now: float) -> Release | None:
        if self._open and not self.waiting_for:
            return self._release(now, ReleaseReason.COMPLETE, self._all_ready())
        return None

    def _release(self, now: float, reason: ReleaseReason, due: float) -> Release:
        members = tuple(self._open.values())
        for key in self.waiting_for:  # expected and absent: not waited for again until it joins a tick
            del self._next[key]
        for m in members:
            if m.key in self._live:
                self._next[m.key] = m.ready + self.period_s
        release = Release(self.ticks, members, now, min(due, now), reason, self.slot_s)
        self.ticks += 1
        self._open = {}
        return release


__all__ = ["EngineTick", "Member", "Release", "ReleaseReason"]
