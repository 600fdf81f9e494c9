"""What outlives a socket (docs/tiered-dialect.md §6): the rotating attachment credential, the resume journal and
the lease deadlines (the disconnect grace while detached, the idle TTL while attached and idle). Pure; time is
injected."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...ids import SYSTEM_IDS, Ids
from .journal import Journal, Replay, ReplayConflict, ResumeCredential, ResyncRequired


@dataclass(frozen=True, slots=True)
class ResumeRefused:
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Reattached:
    """A resume was accepted: the replay, the new token, and the generation it superseded (None: detached)."""

    replay: Replay
    token: str
    generation: int
    superseded: int | None


class Lease:
    def __init__(self, *, resumable: bool, grace_s: float, journal_max_bytes: int, journal_ttl_s: float,
                 ids: Ids = SYSTEM_IDS) -> None:
        self.journal = Journal(max_bytes=journal_max_bytes, ttl_s=journal_ttl_s) if resumable else None
        self.credential = ResumeCredential(ids)
        self.grace_s = grace_s
        self.detached_at: float | None = None
        self.last_activity = 0.0

    def touch(self, now: float) -> None:
        self.last_activity = now

    def detach(self, now: float) -> None:
        """The transport went away: the grace period starts now."""
        if self.detached_at is None:
            self.detached_at = now

    def deadline(self, *, idle: bool, idle_timeout_s: float) -> float | None:
        """When the lease runs out, if nothing happens first."""
        if self.detached_at is not None:
            return self.detached_at + self.grace_s
        if idle:
            return self.last_activity + idle_timeout_s
        return None

    def expiry(self, now: float, *, idle: bool, idle_timeout_s: float) -> str | None:
        """Why the lease has run out at ``now`` (None: it has not)."""
        if self.detached_at is not None and now >= self.detached_at + self.grace_s:
            return "disconnect_grace_expired"
        if idle and now >= self.last_activity + idle_timeout_s:
            return "idle_ttl_expired"
        return None

    def resume(self, token: Any, cursor: int, now: float) -> Reattached | ResumeRefused | ResyncRequired:
        """Attach a new socket if ``token`` is this session's and the journal still holds everything after
        ``cursor``; the old token stays valid until :meth:`rollback`."""
        if self.journal is None:
            return ResumeRefused("unsupported_session_resume", "this session does not support resume")
        if not self.credential.verify(token):
            return ResumeRefused("invalid_resume_token", "the resume token is not valid for this session")
        replay = self.journal.replay_after(cursor, now)
        if isinstance(replay, ReplayConflict):
            return ResumeRefused("session_resume_conflict", f"cursor beyond the last event ({replay.head})")
        if isinstance(replay, ResyncRequired):
            return replay
        old_generation = self.credential.generation
        superseded = old_generation if self.detached_at is None else None
        token = self.credential.issue()
        self.detached_at = None
        self.last_activity = now
        return Reattached(replay, token, self.credential.generation, superseded)

    def rollback(self) -> None:
        """The activation failed mid-send: the old token is valid again and the session stays detached."""
        self.credential.rollback()
