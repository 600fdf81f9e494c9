"""The engine tick on vLLM-Omni: one per engine, shared by every session's port (``runner/tick.py`` decides).

Each session's port steps in that session's model thread. A position joins the tick and its thread blocks until the
tick is released; the thread that releases it (the one whose position completed it, or the first to wake at the
slot's end) submits every member's append in one go on the API event loop, stamped with the tick's number and
size so Stage 0's scheduler can hold them for one forward (``scheduler.VoiceChatStage0Scheduler``). Then each
member's thread waits for its own outputs, as without batching.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass

from ..records import record
from ..runner.tick import EngineTick, Member, Release

Submit = Callable[["TickStamp"], Awaitable[None]]
"""A member's submission, run on the API loop: its controls stamped with the tick, then its append."""

SUBMIT_TIMEOUT_S = 10.0


@record
class TickStamp:
    """What a position carries into Stage 0 about the tick it was released in."""

    tick: int
    size: int
    held_ms: float
    late_ms: float


@dataclass
class _Seat:
    submit: Submit
    stamp: TickStamp | None = None
    outcome: concurrent.futures.Future | None = None
    index: int = 0


class EngineBatcher:
    """The tick of one engine, for threads (see the module docstring)."""

    def __init__(self, slot_s: float, loop: asyncio.AbstractEventLoop, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tick = EngineTick(slot_s)
        self.loop = loop
        self._clock = clock
        self._cond = threading.Condition()
        self._seats: dict[Hashable, _Seat] = {}
        self.releases = 0

    @property
    def slot_s(self) -> float:
        return self.tick.slot_s

    def enter(self, key: Hashable) -> None:
        with self._cond:
            self.tick.enter(key)

    def leave(self, key: Hashable) -> None:
        with self._cond:
            release = self.tick.leave(key, self._clock())
            if release is not None:
                self._dispatch(release)

    def submit(self, key: Hashable, ready: float | None, submit: Submit, *, arrived: float | None = None) -> TickStamp:
        """Join the tick with a position (``ready``: when it could have run; ``arrived``: when its audio reached the
        host, if earlier) and block until its tick is released and its submission has run; returns the stamp, or
        raises what the submission raised."""
        with self._cond:
            now = self._clock()
            seat = self._seats[key] = _Seat(submit)
            release = self.tick.join(key, now if ready is None else ready, now, arrived=arrived)
            while True:
                if release is not None:
                    self._dispatch(release)
                if seat.outcome is not None:
                    break
                deadline = self.tick.deadline
                self._cond.wait(None if deadline is None else max(0.0, deadline - self._clock()))
                release = self.tick.poll(self._clock())
        results = seat.outcome.result(SUBMIT_TIMEOUT_S)
        error = results[seat.index]
        if isinstance(error, BaseException):
            raise error
        assert seat.stamp is not None
        return seat.stamp

    def _dispatch(self, release: Release) -> None:
        """Under the lock: stamp every member and submit them all in one coroutine on the loop."""
        self.releases += 1
        seats = []
        for index, member in enumerate(release.members):
            seat = self._seats.pop(member.key)
            seat.stamp = _stamp(release, member)
            seat.index = index
            seats.append(seat)
        outcome = asyncio.run_coroutine_threadsafe(_submit_all([(s.submit, s.stamp) for s in seats]), self.loop)
        for seat in seats:
            seat.outcome = outcome
        self._cond.notify_all()


def _stamp(release: Release, member: Member) -> TickStamp:
    return TickStamp(release.tick, release.size, release.held_ms(member), release.late_ms(member))


async def _submit_all(submissions: list[tuple[Submit, TickStamp]]) -> list[BaseException | None]:
    results = await asyncio.gather(*(submit(stamp) for submit, stamp in submissions), return_exceptions=True)
    return [r if isinstance(r, BaseException) else None for r in results]


__all__ = ["EngineBatcher", "TickStamp"]
