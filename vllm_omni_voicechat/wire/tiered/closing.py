"""How a tiered socket closes (pure): the first terminal (``session.closed`` or a fatal error) decides the close
code and the frame's reason; the close goes out once, after the core has closed."""

from __future__ import annotations

from ..transport import CloseTransport, close_reason
from .schema import CLOSE_NORMAL, close_code_for


class Closing:
    def __init__(self) -> None:
        self.client_reason = "client_close"
        """The reason of the client's ``session.close`` (what a ``client_stop`` shows)."""
        self.code: int | None = None
        self.reason = ""  # the close frame's reason: the fatal code, else the session.closed reason
        self.label = ""  # the reason for counters when the client's words are in it (see CloseTransport.label)
        self.sent = False

    def session_closed(self, native_reason: str) -> str:
        """The core closed the session: the wire reason of its ``session.closed``."""
        reason = self.client_reason if native_reason == "client_stop" else native_reason
        if self.code is None:
            self.code = CLOSE_NORMAL
            self.reason = reason
            self.label = "client_close" if native_reason == "client_stop" else ""
        return reason

    def failed(self, code: str) -> bool:
        """A fatal error: True when it is the first terminal (it decides the close)."""
        if self.code is not None:
            return False
        self.code = close_code_for(code)
        self.reason = code
        return True

    def transport(self) -> list[CloseTransport]:
        """The core has closed: the close, once a terminal decided it."""
        if self.sent or self.code is None:
            return []
        self.sent = True
        return [CloseTransport(self.code, close_reason(self.reason), self.label)]

    def expired(self, reason: str) -> CloseTransport:
        """The lease expired: a normal close, whatever came before."""
        self.sent = True
        return CloseTransport(CLOSE_NORMAL, close_reason(reason))
