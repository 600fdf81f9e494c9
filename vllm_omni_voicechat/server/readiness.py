"""Whether the server can serve: the engine's health (the host's probe), a failed model cleanup, a failed warm-up, a
model step that timed out. ``/health`` reports it; a failed cleanup also refuses new sessions (the host's check)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from ..model.port import ModelTimeout
from ..shell.aio import SessionShell
from .live import LiveSessions
from .warmup import WarmupReport

log = logging.getLogger("vllm_omni_voicechat.server")


class Readiness:
    def __init__(self, live: LiveSessions) -> None:
        self._live = live
        self.cleanup_failure: str | None = None
        """Set when a session's model abort failed: new sessions are refused."""
        self.model_stall: tuple[float, str] | None = None
        """A session's model step timed out (a stalled engine?): (when, what), degraded until a position completes."""
        self.engine_probe: Callable[[], Awaitable[str | None]] | None = None
        """The host's engine check (inside vllm-omni serve: vLLM-Omni's check_health): why it is broken, or None."""
        self.warmup: WarmupReport | None = None

    @property
    def warmup_failed(self) -> bool:
        return self.warmup is not None and self.warmup.error is not None

    def record_warmup(self, report: WarmupReport) -> None:
        self.warmup = report
        if report.error is None:
            log.info("warmup: %d positions in %.3f s (step ms %s)", report.positions, report.seconds,
                     list(report.step_ms))
        else:
            log.error("warmup failed after %d positions: %s; serving degraded", report.positions, report.error)

    def session_ended(self, session_id: str, shell: SessionShell) -> None:
        """What an ended session says of the model: a failed cleanup, a step that timed out, or a completed position
        after the last stall."""
        if shell.cleanup_error is not None:
            self.cleanup_failure = f"model abort failed: {shell.cleanup_error}"
            log.error("session %s: %s; refusing new sessions", session_id, self.cleanup_failure)
        if isinstance(shell.model_error, ModelTimeout):
            self.model_stall = (time.monotonic(), shell.model_failure or str(shell.model_error))
            log.error("session %s: model step timed out (%s); serving degraded", session_id, shell.model_failure)
        elif self.model_stall is not None and (shell.last_step_at or 0.0) > self.model_stall[0]:
            self.model_stall = None

    def _stall(self) -> str | None:
        """The last model stall, unless a position has completed since (the engine answers again)."""
        stall = self.model_stall
        if stall is not None and any((r.shell.last_step_at or 0.0) > stall[0] for r in self._live.hosted()):
            self.model_stall = stall = None
        return None if stall is None else stall[1]

    def status(self, engine_failure: str | None = None) -> tuple[str, str | None]:
        """``/health``'s status and why it is not ``ready``: ``failed`` when the engine is broken (``engine_failure``,
        from the host's probe), ``degraded`` after a failed model cleanup, a failed warm-up or a model stall."""
        if engine_failure is not None:
            return "failed", engine_failure
        if self.cleanup_failure:
            return "degraded", self.cleanup_failure
        if self.warmup_failed:
            return "degraded", f"warmup failed: {self.warmup.error}"  # type: ignore[union-attr]
        stall = self._stall()
        if stall is not None:
            return "degraded", f"a model step timed out ({stall}); no position has completed since"
        return "ready", None
