"""The process heap, when the server owns its process (the CLI, the soak; not inside vllm-omni serve, where vLLM
freezes its own): start-up's objects frozen out of the cycle collector's sight, and ended sessions collected soon.

An ended session is a web of reference cycles (the core's parts point back at their core, bound methods at their
owners, tasks at their frames), so reference counting never frees it; only a full collection does. The collector's
own trigger counts net allocations, and a server that frees almost everything by reference counting reaches it
rarely: in the 1-hour soak dead sessions piled up for 16 minutes before the first one. So a session's end asks for a
full collection: as soon as its handler has returned, or once ``interval_s`` has passed since the last one (one timer
at a time). With start-up frozen, a full collection walks only what live and dead sessions made (~2-4 ms at 8).

A full collection stops the event loop for as long as it walks every live session's objects: ~0.2 ms a session
(60-63 ms at 288 v3 sessions, measured), long enough to make positions late. The collector's own trigger (a quarter
more long-lived objects than at the last full collection: every ~50 s at 288 steady sessions) is therefore off, and
full collections run only when asked: at session ends as above, and as a backstop ``backstop_s`` after the last one
for the stray cycles of a server whose sessions do not end (~50 objects/s measured). Young collections run as usual.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

DEFAULT_INTERVAL_S = 2.0
DEFAULT_BACKSTOP_S = 600.0
NO_AUTOMATIC_FULL = 1 << 30
"""The oldest generation's threshold when the server owns its process: young collections never reach it."""


class Heap:
    def __init__(self, *, managed: bool, interval_s: float = DEFAULT_INTERVAL_S,
                 backstop_s: float = DEFAULT_BACKSTOP_S, collect: Callable[[], object] = gc.collect) -> None:
        self.managed = managed
        self.interval_s = interval_s
        self.backstop_s = backstop_s
        self.collections = 0
        self._collect = collect
        self._last: float | None = None
        self._pending = False

    def started(self, now: float) -> None:
        """The server has started: freeze what start-up made; full collections from now on only when asked."""
        if not self.managed:
            return
        gc.collect()
        gc.freeze()
        # Frozen objects leave the collector's long-lived count only at the next full collection: without it the
        # first one would wait for a quarter of start-up's object count to be promoted.
        gc.collect()
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, NO_AUTOMATIC_FULL)
        self._last = now

    def session_ended(self, now: float) -> float | None:
        """The delay after which :meth:`collect_due` should run: none left when the last collection is an interval
        old (the edge still runs it from the loop, once the ended session's handler has returned and dropped its
        references), the rest of the interval otherwise; None when nothing is to be done or a timer is set."""
        if not self.managed or self._pending:
            return None
        self._pending = True
        return 0.0 if self._last is None else max(0.0, self._last + self.interval_s - now)

    def backstop(self, now: float) -> float | None:
        """Collect if the last full collection is ``backstop_s`` old; the delay to the next check (None when the
        heap is not ours)."""
        if not self.managed:
            return None
        if self._last is None or now - self._last >= self.backstop_s:
            self.collect_due(now)
        assert self._last is not None
        return self._last + self.backstop_s - now

    def collect_due(self, now: float) -> None:
        self._pending = False
        self._last = now
        self.collections += 1
        self._collect()
