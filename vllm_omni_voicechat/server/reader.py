"""One socket's reader: client frames into its session's inbox, in order, until the socket drops, is replaced by a
resumed one, or the session ends.

On our uvicorn protocol frames go from the parser straight into the inbox (:class:`DirectReader`): no ASGI message,
Starlette receive or task wake-up per frame, which a session pays ~12 times a second. A frame that cannot
be taken at once (a resume is settling the input, or the inbox and its refusals are full) is held, reading stops
(TCP backpressure), and a task hands the held frames on in order. Disconnects still arrive through ASGI. Elsewhere
(vLLM-Omni's own uvicorn) every frame is an ASGI receive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from starlette.websockets import WebSocket

from ..trace.tap import traced
from ..wire.limits import utf8_exceeds
from .attachment import Attachment
from .uvicorn import AbortableWebSockets, protocol_for

log = logging.getLogger("vllm_omni_voicechat.server")


async def read_socket(att: Attachment, websocket: WebSocket) -> None:
    """Read ``websocket`` into ``att``'s session; when it drops, detach it (a tiered session waits for a resume)."""
    try:
        direct = protocol_for(websocket)
        if direct is not None:
            await DirectReader(att, websocket, direct).run()
        else:
            while await _take_asgi(att, websocket):
                pass
    except Exception:  # a transport error is a drop like any other, never a session left hanging
        log.debug("socket reader failed", exc_info=True)
    outbox = att.outbox if att.socket is websocket else None
    att.detach(websocket)
    if outbox is not None:
        outbox.abort()  # the client is gone: nothing queued can reach it


async def _take_asgi(att: Attachment, websocket: WebSocket) -> bool:
    """Read one ASGI message and hand its frame on; False once the socket is gone or replaced."""
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        return False
    if not att.reads_open.is_set():
        await att.reads_open.wait()  # a resume is settling the input: this frame waits for its outcome
    if att.socket is not websocket or att.shell is None:
        return False  # replaced by a resumed socket
    data = message.get("text") if message.get("text") is not None else message.get("bytes")
    limit = att.max_message_bytes
    if data is not None and limit is not None and utf8_exceeds(data, limit):
        with contextlib.suppress(Exception):
            await websocket.close(1009, "message too big")  # what websockets does under our protocol
        return False
    if data is not None:
        await att.shell.offer(data)
    return True


class DirectReader:
    """Frames from our protocol's parser to the session's inbox (see the module docstring)."""

    def __init__(self, att: Attachment, websocket: WebSocket, protocol: AbortableWebSockets) -> None:
        self.att = att
        self.websocket = websocket
        self.protocol = protocol
        self.trace = traced(websocket)
        self.held: deque[str | bytes] = deque()
        self.done = asyncio.get_running_loop().create_future()  # the socket was replaced, or a hand-over failed
        self._drainer: asyncio.Task | None = None
        self._paused = False

    async def run(self) -> None:
        att, websocket, protocol = self.att, self.websocket, self.protocol
        # What the ASGI queue already holds (read before this reader started) goes first, in order.
        while protocol.queue.qsize():
            if not await _take_asgi(att, websocket):
                return
        protocol.receiver = self.receive
        disconnected = asyncio.ensure_future(websocket.receive())  # frames no longer come this way: only the end
        try:
            await asyncio.wait({disconnected, self.done}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            protocol.receiver = None
            disconnected.cancel()
            if self._drainer is not None:
                self._drainer.cancel()
            await asyncio.gather(disconnected, *([self._drainer] if self._drainer else []), return_exceptions=True)
            if self._paused:
                self._resume_reading()

    def receive(self, data: str | bytes) -> None:
        """One client frame, from the protocol's ``data_received``."""
        if self.done.done():
            return  # replaced: what the old socket still sends is not read (the receipt tells the client)
        if self.trace is not None:
            self.trace.client_event(data)
        att = self.att
        try:
            if not self.held and att.reads_open.is_set():
                if self._replaced():
                    return
                if att.shell.offer_nowait(data) is not None:
                    return
            self.held.append(data)
            if not self._paused:
                self._paused = True
                self.protocol.transport.pause_reading()
            if self._drainer is None:
                self._drainer = asyncio.ensure_future(self._drain())
        except Exception:  # never into uvicorn's data_received: this socket's reading ends instead
            log.debug("socket reader failed", exc_info=True)
            if not self.done.done():
                self.done.set_result(None)

    async def _drain(self) -> None:
        att = self.att
        try:
            while self.held:
                if not att.reads_open.is_set():
                    await att.reads_open.wait()
                if self._replaced():
                    return
                await att.shell.offer(self.held[0])
                self.held.popleft()
        finally:
            self._drainer = None
        self._resume_reading()

    def _replaced(self) -> bool:
        """This socket is no longer the session's (a resume took over, or the session is gone): reading ends."""
        if self.att.socket is self.websocket and self.att.shell is not None:
            return False
        if not self.done.done():
            self.done.set_result(None)
        return True

    def _resume_reading(self) -> None:
        self._paused = False
        with contextlib.suppress(Exception):  # the transport may be closing
            self.protocol.transport.resume_reading()
