"""Typed input: request validation in the contract's rejection order, the job record, and the typed-job queue
(one job at a time, later requests waiting behind it, replacement before the model was touched)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from .commands import RequestTypedInput
from .events import (
    CancelSynthesis,
    Error,
    Output,
    StartSynthesis,
    TypedAccepted,
    TypedInjectionFinished,
    TypedRejected,
)
from .work import InjectTyped

if TYPE_CHECKING:
    from .core import SessionCore
    from .microphone import Microphone
    from .work import WorkQueue
    from .events import Disposition

MAX_TYPED_TEXT_CHARS = 1000
MAX_JOB_ID_CHARS = 128
MAX_QUEUED_TYPED_REQUESTS = 8

JobState = Literal["synthesizing", "ready", "mutated", "done"]


def rejection_reason(
    job_id: object,
    text: object,
    *,
    configured: bool,
    synthesizer_ready: bool,
    mic_turn_open: bool,
    function_cycle_open: bool,
    used_job_ids: Container[str],
) -> str | None:
    """The first rejection reason that applies, or None when the request is acceptable."""
    if not configured:
        return "session_not_configured"
    if not synthesizer_ready:
        return "typed_input_unavailable"
    if mic_turn_open:
        return "input_turn_active"
    if function_cycle_open:
        return "function_cycle_active"
    if not isinstance(job_id, str) or not 1 <= len(job_id) <= MAX_JOB_ID_CHARS:
        return "invalid_job_id"
    if job_id in used_job_ids:
        return "duplicate_job_id"
    if not isinstance(text, str) or not text.strip():
        return "empty_text"
    if len(text) > MAX_TYPED_TEXT_CHARS:
        return "text_too_long"
    return None


@dataclass(slots=True)
class TypedJob:
    job_id: str
    text: str
    state: JobState = "synthesizing"
    pcm: bytes = b""
    turn_id: str | None = None
    frames: list[bytes] = field(default_factory=list)

    @property
    def mutated(self) -> bool:
        return self.state in ("mutated", "done")

    @property
    def started(self) -> bool:
        """Its procedure began (a cancel tail may run before the first typed position)."""
        return self.mutated or self.turn_id is not None


class TypedJobs:
    """The session's typed-job queue: the active job, the requests waiting behind it and every id used.

    It emits through the core's output list and queues the active job's injection on the core's work queue; a
    request is handed the core, whose state decides whether it is accepted.
    """

    def __init__(self, emit: Callable[[Output], None], work: WorkQueue, microphone: Microphone, *,
                 max_waiting: int = MAX_QUEUED_TYPED_REQUESTS) -> None:
        self._emit = emit
        self._work = work
        self._microphone = microphone
        self.max_waiting = max_waiting
        self.job: TypedJob | None = None
        self.waiting: deque[RequestTypedInput] = deque()
        self.used: set[str] = set()
        """Ids of every accepted job (a job once accepted locks the session's settings)."""

    def __contains__(self, job_id: object) -> bool:
        """An id taken by an accepted job or a waiting request (no copy of the used set per request: a session's
        history would make each request cost more than the last)."""
        return job_id in self.used or any(r.job_id == job_id for r in self.waiting)

    def request(self, core: SessionCore, cmd: RequestTypedInput) -> None:
        reason = rejection_reason(
            cmd.job_id,
            cmd.text,
            configured=core.configured,
            synthesizer_ready=core.config.typed_input_ready,
            mic_turn_open=core.turns.turn_open,
            function_cycle_open=core.functions.cycle is not None,
            used_job_ids=self,
        )
        if reason is not None:
            self._emit(TypedRejected(cmd.job_id, reason))
            return
        job = self.job
        if job is not None and not job.started:
            # Replacement: cancel -> close -> start, before the old job touched the model.
            self._withdraw(core, job, "replaced")
        elif job is not None:
            if len(self.waiting) >= self.max_waiting:
                self._emit(TypedRejected(cmd.job_id, "typed_input_unavailable"))
                return
            self.waiting.append(cmd)
            return
        self._accept(cmd)

    def _accept(self, cmd: RequestTypedInput) -> None:
        assert isinstance(cmd.job_id, str) and isinstance(cmd.text, str)
        job = TypedJob(cmd.job_id, cmd.text)
        self.used.add(job.job_id)
        self.job = job
        self._microphone.drop_partial()
        self._emit(TypedAccepted(job.job_id))
        self._emit(StartSynthesis(job.job_id, job.text))
        self._work.append(InjectTyped(job))

    def finish(self, core: SessionCore, job: TypedJob, disposition: Disposition) -> None:
        job.state = "done"
        if self.job is job:
            self.job = None  # readiness barrier: cleared before injection_finished is sent
        self._emit(TypedInjectionFinished(job.job_id, disposition))
        while self.job is None and self.waiting and not core.stopping:
            self.request(core, self.waiting.popleft())

    def release(self, core: SessionCore, *, procedure_ends: bool) -> None:
        """Answer waiting requests and cancel an accepted job that has not touched the model.

        A job whose procedure already runs (its cancel tail) is left to it, unless that procedure ends too.
        """
        while self.waiting:
            self._emit(TypedRejected(self.waiting.popleft().job_id, "typed_input_unavailable"))
        job = self.job
        if job is not None and not job.mutated and (procedure_ends or not job.started):
            self._withdraw(core, job, "cancelled")

    def _withdraw(self, core: SessionCore, job: TypedJob, disposition: Disposition) -> None:
        self._work.drop_job(job)
        if job.state == "synthesizing":
            self._emit(CancelSynthesis(job.job_id))
        self.finish(core, job, disposition)

    def synthesized(self, job_id: str, pcm16: bytes) -> bool:
        """The active job's audio is ready; False when it is not whole PCM16 samples (a failed synthesis)."""
        job = self.job
        if job is None or job.job_id != job_id or job.state != "synthesizing":
            return True  # stale: a replaced or cancelled job
        if not pcm16 or len(pcm16) % 2:
            return False
        job.pcm = pcm16
        job.state = "ready"
        return True

    def synthesis_failed(self, core: SessionCore, job_id: str, error: BaseException) -> None:
        job = self.job
        if job is None or job.job_id != job_id or job.mutated:
            return
        self._work.drop_job(job)
        self._emit(Error("typed_input_failed", f"typed input synthesis failed: {error}", False, job_id))
        self.finish(core, job, "error")
