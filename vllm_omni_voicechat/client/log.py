"""The client's log of received server events and waiting on it: every wait re-checks after each change (a
received event, an arbiter move), raises the session's failure, and ends when the session ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from .contract import Event, ProtocolError, SessionEnded, V3ClientError

Match = str | Callable[[Event], bool]


def _matcher(match: Match) -> Callable[[Event], bool]:
    return (lambda e: e["type"] == match) if isinstance(match, str) else match


class EventLog:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.failure: V3ClientError | None = None
        self._finished = False
        self._changed = asyncio.Event()

    async def _fail(self, error: V3ClientError) -> None:
        """Record ``error`` as the session's failure and end the session (the transport's business)."""
        raise NotImplementedError

    async def wait_for(self, match: Match, timeout: float = 15.0, *, since: int = 0, fatal: bool = False) -> Event:
        """The first received event at index ``>= since`` of :attr:`events` that matches (a type or a predicate).

        Already received events count, so there is no race with the receiver. On timeout raises
        :class:`TimeoutError`, or with ``fatal`` fails the session with a :class:`ProtocolError`.
        """
        matches = _matcher(match)
        cursor = since

        def find() -> Event | None:
            nonlocal cursor
            while cursor < len(self.events):
                event = self.events[cursor]
                cursor += 1
                if matches(event):
                    return event
            return None

        return await self._until(find, timeout, f"an event matching {match!r}", fatal=fatal)

    async def wait_until(self, check: Callable[[], Any], timeout: float = 15.0) -> Any:
        """Wait until ``check()`` is truthy, re-checked after every received event and every arbiter change."""
        return await self._until(lambda: check() or None, timeout, "the awaited condition")

    def __aiter__(self) -> AsyncIterator[Event]:
        return self.iter_events()

    async def iter_events(self, since: int = 0) -> AsyncIterator[Event]:
        """Every received event from index ``since``, live; ends when the session ends, raising its failure."""
        i = since
        while True:
            while i < len(self.events):
                yield self.events[i]
                i += 1
            if self._finished:
                if self.failure is not None:
                    raise self.failure
                return
            await self._changed.wait()

    async def _until(self, check: Callable[[], Any], timeout: float, what: str, *, fatal: bool = False) -> Any:
        """Wait until ``check()`` is not None, re-checking after every received event."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    result = check()
                    if result is not None:
                        return result
                    if self.failure is not None:
                        raise self.failure
                    if self._finished:
                        raise SessionEnded(f"the session ended while waiting for {what}")
                    await self._changed.wait()
        except TimeoutError:
            if not fatal:
                raise TimeoutError(f"no {what} within {timeout} s") from None
            error = ProtocolError(f"no {what} within {timeout} s")
            await self._fail(error)
            raise error from None

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
