"""Typed-input requests: validation in the contract's rejection order, and the job record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

MAX_TYPED_TEXT_CHARS = 1000
MAX_JOB_ID_CHARS = 128

JobState = Literal["synthesizing", "ready", "mutated", "done"]


def rejection_reason(
    job_id: object,
    text: object,
    *,
    configured: bool,
    synthesizer_ready: bool,
    mic_turn_open: bool,
    function_cycle_open: bool,
    used_job_ids: set[str],
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
