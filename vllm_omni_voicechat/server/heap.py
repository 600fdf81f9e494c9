"""The process heap, when the server owns its process (the CLI, the soak; not inside vllm-omni serve, where vLLM
freezes its own): start-up's objects frozen out of the cycle collector's sight, and full collections only as a rare
backstop.

An ended session is freed by reference counting at its handler's return (the core's parts never keep their core, an
ended shell drops its sink, the outbox's callbacks and writer leave no cycle, a lost socket lets go of websockets'
parser: ``tests/test_session_freed.py`` runs sessions and a refused connection with the collector off), so nothing
has to be collected when sessions or connections end. A full collection stops the event loop for as long as it
walks every live session's objects (~0.1-0.2 ms a session: 26-63 ms at ~300 v3 sessions, 78 ms when it ran after
224 tiered sessions ended together), long enough to make positions late. The collector's own trigger for full
collections (a quarter more long-lived objects than at the last one) is therefore off, young collections run as
usual, and a full collection runs only as a backstop ``backstop_s`` after the last one, for cycles made elsewhere (a
library's, a test's). ``collect_after_ends`` brings back the former policy, a full collection soon after each
session's end (at most one every ``interval_s``): ``benchmarks/session_end_pause.py`` compares the two.

The C heap is trimmed every ``trim_interval_s`` (glibc's ``malloc_trim``, ~0.1 ms): after a client's 15 MB messages
are freed, glibc's dynamic mmap threshold has risen and keeps the next ones in its heap, which it never hands back
by itself (a tiered JSON-bomb attack left the server 37 MB above its baseline; trimmed, 9 MB: the attacker's
detached session and its journal, until its grace ends). Where the C library has no ``malloc_trim``, nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable

DEFAULT_INTERVAL_S = 2.0
DEFAULT_BACKSTOP_S = 600.0
TRIM_INTERVAL_S = 1.0
NO_AUTOMATIC_FULL = 1 << 30
"""The oldest generation's threshold when the server owns its process: young collections never reach it."""


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none (musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


class Heap:
    def __init__(self, *, managed: bool, interval_s: float = DEFAULT_INTERVAL_S,
                 backstop_s: float = DEFAULT_BACKSTOP_S, collect_after_ends: bool = False,
                 collect: Callable[[], object] = gc.collect, trim_interval_s: float = TRIM_INTERVAL_S,
                 trim: Callable[[], object] | None = None) -> None:
        self.managed = managed
        self.trim_interval_s = trim_interval_s
        self._trim = trim if trim is not None else (_malloc_trim() if managed else None)
        self.trims = 0
        self.collect_after_ends = collect_after_ends
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
        references), the rest of the interval otherwise; None when nothing is to be done (the default: an ended
        session frees itself) or a timer is set."""
        if not self.managed or not self.collect_after_ends or self._pending:
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

    def trim_due(self) -> float | None:
        """Hand the C heap's free memory back to the system; the delay to the next trim (None: not ours to trim)."""
        if not self.managed or self._trim is None:
            return None
        self._trim()
        self.trims += 1
        return self.trim_interval_s
