"""A server ``trace_factory`` that checks every socket it serves (tests, benchmarks): one ``TraceChecker`` each."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .checker import TraceChecker


class TraceRecorder:
    """``ServerConfig(trace_factory=TraceRecorder())``; ``violations()`` / ``check()`` once the server is done.

    Sockets are created on the server's loop while a benchmark or test reads from another thread, hence the lock.
    ``inner`` (optional) is another factory fed the same stream (a test's own observer)."""

    def __init__(self, inner: Callable[[str], Any] | None = None, *, history: int = 40) -> None:
        self.traces: list[TraceChecker] = []
        self._inner = inner
        self._history = history
        self._lock = threading.Lock()

    def __call__(self, dialect: str) -> Any:
        with self._lock:
            checker = TraceChecker(dialect, name=f"{dialect} socket {len(self.traces) + 1}",  # type: ignore[arg-type]
                                   history=self._history)
            self.traces.append(checker)
        if self._inner is None:
            return checker
        return _Both(checker, self._inner(dialect))

    def violations(self) -> list[str]:
        with self._lock:
            traces = list(self.traces)
        return [f"{t.name}: {v}" for t in traces for v in t.violations]

    def summary(self) -> dict[str, Any]:
        """For a benchmark's JSON: sockets checked and the violations found (the first 50)."""
        found = self.violations()
        return {"sockets": len(self.traces), "violations": len(found), "first_violations": found[:50]}

    def check(self) -> None:
        """Raise listing every socket's violations (the invariants are server guarantees)."""
        with self._lock:
            traces = list(self.traces)
        failures = []
        for trace in traces:
            try:
                trace.check()
            except AssertionError as exc:
                failures.append(str(exc))
        if failures:
            raise AssertionError("server trace invariants violated:\n" + "\n".join(failures))


class _Both:
    def __init__(self, *traces: Any) -> None:
        self._traces = traces

    def client_event(self, message: Any) -> None:
        for t in self._traces:
            t.client_event(message)

    def server_event(self, message: Any) -> None:
        for t in self._traces:
            t.server_event(message)

    def transport_closed(self, code: int | None) -> None:
        for t in self._traces:
            t.transport_closed(code)
