"""A session and the socket it is attached to (None while detached), with that socket's outbox.

Puts never wait, so a resume's replay and live events never interleave; ``sent_through`` drops live events a
replay already carried. What an outbox overflow means is the dialect's policy: a tiered session's socket is detached
like a dropped one (the full lane's client resumes from the journal within the grace); a v3 session fails
(``fail_on_overflow``: its model is released at once; the fatal ``output_backpressure`` error and close 1011 go out
after a discard).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.websockets import WebSocket

from ..shell.aio import SessionShell
from ..wire.transport import CloseTransport, WireText
from .config import ServerConfig
from .outbox import Outbox


class Attachment:
    def __init__(self, protocol: Any, config: ServerConfig, *, fail_on_overflow: bool = False,
                 max_message_bytes: int | None = None) -> None:
        self.protocol = protocol
        self.config = config
        self.fail_on_overflow = fail_on_overflow
        self.max_message_bytes = max_message_bytes
        """The dialect's largest client message, for sockets our protocol does not serve (it refuses larger ones
        itself, before buffering them): a larger one closes the socket with 1009."""
        self.shell: SessionShell | None = None
        self.socket: WebSocket | None = None
        self.outbox: Outbox | None = None
        self.lock = asyncio.Lock()
        self.resuming = asyncio.Lock()  # one resume at a time: its read fence and receipt are its own
        self.reads_open = asyncio.Event()
        """Cleared while a resume settles the input: a frame read meanwhile waits, and is dropped if the socket it
        came from was replaced (the receipt in ``session.resumed`` does not count it: the client resends it)."""
        self.reads_open.set()
        self.sent_through = 0
        self.close_code: int | None = None
        self.close_reason = ""
        self.close_label = ""
        """The close reason in the server's vocabulary (counters, logs): never a client's words."""
        self.ended = asyncio.Event()
        self.overflows = 0
        self._peaks = (0, 0)  # the largest outbound queue (bytes, events) of the outboxes no longer current
        self._closers: set[asyncio.Task] = set()

    @property
    def peak_outbound_bytes(self) -> int:
        """The most bytes the session's outboxes held queued (read when asked: sends do not copy it)."""
        outbox = self.outbox
        return self._peaks[0] if outbox is None else max(self._peaks[0], outbox.peak_bytes)

    @property
    def peak_outbound_events(self) -> int:
        outbox = self.outbox
        return self._peaks[1] if outbox is None else max(self._peaks[1], outbox.peak_events)

    def _set_outbox(self, outbox: Outbox | None) -> None:
        """Replace the current outbox (None: none), keeping the peaks of the one it replaces."""
        old = self.outbox
        if old is not None:
            self._peaks = (max(self._peaks[0], old.peak_bytes), max(self._peaks[1], old.peak_events))
        self.outbox = outbox

    @property
    def detached_overflows(self) -> int:
        """Overflows that detached the socket (the tiered policy)."""
        return 0 if self.fail_on_overflow else self.overflows

    def attach(self, ws: WebSocket, *, resume_outputs: int = 0) -> Outbox:
        """Make ``ws`` the current socket, with a fresh outbox; the previous one (if any) is left to the caller.
        A resumed socket whose ``resume_outputs`` (``session.resumed`` + replay) are not all written when it fails
        rolls the credential back: the client may never have seen the new token."""

        def gone(outbox: Outbox) -> None:
            if self.socket is ws and outbox.sent_events < resume_outputs:
                self.protocol.rollback_resume()
            self.detach(ws)

        outbox = Outbox(ws, self.config, on_overflow=lambda: self._overflow(ws), on_gone=gone)
        self.socket = ws
        self._set_outbox(outbox)
        return outbox

    async def settled(self) -> None:
        """Until the session has taken in every frame already read from its sockets, or has ended."""
        if self.shell is None:
            return
        settled = asyncio.ensure_future(self.shell.settled())
        ended = asyncio.ensure_future(self.ended.wait())
        try:
            await asyncio.wait({settled, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            settled.cancel()
            ended.cancel()

    def sink(self, item: Any) -> None:
        """The shell's sink: what the protocol object hands its transport (never waits: puts are queued)."""
        if isinstance(item, WireText):  # most items: checked first
            outbox, seq = self.outbox, item.seq
            if self.socket is None or outbox is None or (seq is not None and seq <= self.sent_through):
                return  # detached (the journal keeps it) or already replayed on this socket
            # False: overflow (the session's policy ran) or the client left
            if outbox.put(item.text) and seq is not None:
                self.sent_through = seq
        elif isinstance(item, CloseTransport):
            self.close_code = item.code
            self.close_reason = item.reason
            self.close_label = item.label or item.reason

    def _overflow(self, ws: WebSocket) -> None:
        if self.socket is not ws:
            return
        self.overflows += 1
        if self.fail_on_overflow:
            self.close_label = "output_backpressure"  # how it ended, for the counters (not the client leaving)
            if self.shell is not None:
                self.shell.disconnect()  # the session fails silently now; its error goes out when it has ended
            return
        outbox = self.outbox
        self.detach(ws)
        if outbox is not None:
            outbox.abort()

    def detach(self, ws: WebSocket) -> None:
        if self.socket is not ws:
            return  # a superseded socket going away changes nothing
        self.socket = None
        self._set_outbox(None)
        if self.protocol.resumable:
            # Set at once, on the loop: a resume arriving before the shell's next turn sees the session detached.
            self.protocol.detach(time.monotonic())
            if self.shell is not None:
                self.shell.wake()  # the grace deadline is a new wake-up time
        elif self.shell is not None:
            self.shell.disconnect()

    def retire(self, outbox: Outbox | None, code: int, reason: str = "") -> None:
        """Close a socket that is no longer current, in the background (a stalled one is cut off)."""
        if outbox is None:
            return
        outbox.close(code, reason)
        task = asyncio.create_task(outbox.closed())
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)

    async def finish(self) -> None:
        """The session has ended: close the current socket (after the queued events) and wait for every close."""
        outbox, self.socket = self.outbox, None
        self._set_outbox(None)
        if outbox is not None:
            if outbox.overflowed and not outbox.gone and self.fail_on_overflow:
                outbox.discard()
                outbox.put(self.protocol.output_backpressure(
                    peak_queued_bytes=outbox.peak_bytes, max_outbound_bytes=outbox.max_bytes,
                    max_outbound_events=outbox.max_events).text, force=True)
                outbox.close(1011, "output_backpressure")
            else:
                outbox.close(self.close_code or 1000, self.close_reason if self.close_code else "")
            await outbox.closed()
        if self._closers:
            await asyncio.gather(*self._closers, return_exceptions=True)

    def stats(self, dialect: str) -> dict[str, Any]:
        shell = self.shell
        assert shell is not None
        return {"dialect": dialect, "session_id": self.protocol.session_id,
                "peak_outbound_bytes": self.peak_outbound_bytes, "peak_outbound_events": self.peak_outbound_events,
                "outbound_overflows": self.overflows, "peak_inbox_messages": shell.peak_inbox_messages,
                "peak_inbox_bytes": shell.peak_inbox_bytes, "refused_messages": shell.refused}
