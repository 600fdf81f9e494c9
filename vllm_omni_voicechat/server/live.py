"""The server's sessions: one record per session, from the start of its loop until its socket has closed.

A record is hosted while its loop runs (counted, resumable when tiered), then draining: the session has ended and
its slot is free, but its socket's close handshake is not over. Membership, lookup and iteration see hosted
records only; ``draining`` lists the others (operators' views).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..shell.aio import SessionShell
from .attachment import Attachment


@dataclass(slots=True)
class LiveSession:
    session_id: str
    dialect: str
    """``v3`` or ``tiered``."""
    attachment: Attachment
    """The session's protocol object, its shell and the socket it is attached to (None while detached)."""
    started_at: float
    draining_since: float | None = None
    """When the session ended (its socket still closing); None while hosted."""

    @property
    def shell(self) -> SessionShell:
        shell = self.attachment.shell
        assert shell is not None  # set before the record is added
        return shell

    @property
    def protocol(self) -> Any:
        return self.attachment.protocol


class LiveSessions:
    def __init__(self) -> None:
        self._records: dict[str, LiveSession] = {}

    def add(self, record: LiveSession) -> None:
        self._records[record.session_id] = record

    def ended(self, session_id: str, now: float) -> None:
        """The session's loop has returned: it drains (its socket is closing) until :meth:`remove`."""
        record = self._records.get(session_id)
        if record is not None:
            record.draining_since = now

    def remove(self, session_id: str) -> None:
        self._records.pop(session_id, None)

    def resumable(self, session_id: str) -> Attachment | None:
        """The attachment a ``session.resume`` reattaches to: a hosted tiered session's, not yet ended."""
        record = self.get(session_id)
        if record is None or record.dialect != "tiered" or record.attachment.ended.is_set():
            return None
        return record.attachment

    def get(self, session_id: str) -> LiveSession | None:
        record = self._records.get(session_id)
        return record if record is not None and record.draining_since is None else None

    def hosted(self) -> list[LiveSession]:
        return [r for r in self._records.values() if r.draining_since is None]

    def draining(self) -> list[LiveSession]:
        return [r for r in self._records.values() if r.draining_since is not None]

    def __getitem__(self, session_id: str) -> LiveSession:
        record = self.get(session_id)
        if record is None:
            raise KeyError(session_id)
        return record

    def __contains__(self, session_id: object) -> bool:
        return isinstance(session_id, str) and self.get(session_id) is not None

    def __iter__(self) -> Iterator[str]:
        return iter([r.session_id for r in self.hosted()])

    def __len__(self) -> int:
        return len(self.hosted())
