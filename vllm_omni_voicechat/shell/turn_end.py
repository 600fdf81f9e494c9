"""Callbacks run when the event loop's current turn is over, batched: one handle a turn for every session.

A session that wants something done once the callbacks of this turn of the loop have run (its outbox written in one
go, a slice of work that lasts one turn at most) would schedule its own ``call_soon``: at 300 sessions that is a
handle made, queued and run per client frame. Here the first caller of a turn schedules one, and the others join
its list. Order is kept (callbacks run in the order they were added), and one that raises goes to the loop's
exception handler without stopping the rest, as a handle of its own would.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable

_TURN_ENDS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, TurnEnd] = weakref.WeakKeyDictionary()


class TurnEnd:
    """One loop's batch of callbacks for the end of its current turn, and how many turns have ended."""

    __slots__ = ("_loop", "_callbacks", "turns", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._callbacks: list[Callable[[], object]] = []
        self.turns = 0
        """How many batches have run: a value read twice within one turn of the loop is the same."""

    def call(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` once this turn of the loop is over (as ``loop.call_soon`` would)."""
        callbacks = self._callbacks
        if not callbacks:
            self._loop.call_soon(self._run)
        callbacks.append(callback)

    def mark(self) -> int:
        """The current turn's number; it changes once this turn is over (a callback is due then)."""
        if not self._callbacks:
            self.call(_nothing)  # a batch due, so that the number moves on
        return self.turns

    def _run(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        self.turns += 1
        for callback in callbacks:
            try:
                callback()
            except Exception as exc:  # as a handle's own: reported, and the others still run
                self._loop.call_exception_handler({"message": "Exception in a turn-end callback", "exception": exc,
                                                   "callback": callback})


def _nothing() -> None:
    pass


def turn_end(loop: asyncio.AbstractEventLoop) -> TurnEnd:
    """``loop``'s batch (made on first use, dropped with the loop)."""
    batch = _TURN_ENDS.get(loop)
    if batch is None:
        batch = _TURN_ENDS[loop] = TurnEnd(loop)
    return batch
