"""The session's fatal path as one exception, in the manner of h11's ``LocalProtocolError``: a part that finds the
session cannot go on raises :class:`SessionFailure` where it finds it; the core's entry points catch it and run the
one teardown (``SessionCore.fatal``: the model aborted, every open bracket and typed job answered, the error, the
close). Nothing after the raise runs, so no part checks whether the session closed under it."""

from __future__ import annotations

from ..errors import VoicechatError


class SessionFailure(VoicechatError):
    """A fatal error for the client: its code, message and details, and how the session ends."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        client_event_id: str | None = None,
        details: dict | None = None,
        closed: tuple[str, str] | None = None,
        brackets: str | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.client_event_id = client_event_id
        self.details = details
        self.closed = closed
        """``session.closed``'s (status, reason), where the contract sends one after the error."""
        self.brackets = brackets
        """Close the open brackets after the error with this reason (the position guard), not before it."""
