"""Our uvicorn: a server that ends our sessions first when it shuts down, and a WebSocket protocol that lets the
app drop a connection and write many small events cheaply.

ASGI has no abort, and a graceful close waits on a reader that may never read. uvicorn takes a protocol class for
its ``ws`` setting; ours is its default one (the websockets sans-I/O protocol), recorded under the connection's
addresses, which the ASGI scope carries as ``client`` and ``server``, so the app can find its transport. Under
another ASGI server (vLLM-Omni's own uvicorn) no protocol is known: a stalled socket is closed, not reset, and
events go out one ASGI send each.

A session sends 2-3 events per 80 ms position and receives about one, so per-message costs dominate the server
at a few hundred sessions: ours writes every event queued for a socket in one transport write (one
send syscall, not one per event and its ASGI round trip), and pauses reading only when the app falls
``READ_AHEAD_MESSAGES`` behind (uvicorn pauses after every message and resumes on the next receive). Once a session's
reader sets ``receiver`` (server/reader.py), each message goes straight to it instead of the ASGI queue.
"""

from __future__ import annotations

import asyncio
import signal
import struct
from collections.abc import Callable, Sequence
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
import numpy as np
from websockets.frames import apply_mask
from websockets.protocol import Protocol, State
from websockets.server import ServerProtocol

from .reading import INBOUND_BURST_BYTES, INBOUND_BYTES_PER_S, ByteBudget, GatedReading

_Key = tuple[str, int, str, int]
REQUEST_HEAD_TIMEOUT_S = 10.0
"""How long a new connection may take to send its request head (HAProxy's usual ``timeout http-request``)."""
READ_AHEAD_MESSAGES = 16
"""Inbound messages uvicorn may queue for the app before it stops reading the socket (backpressure)."""
READ_AHEAD_BYTES = 1 << 20
"""A message this large stops reading until the app has taken it (whatever the count)."""
CLOSE_LINGER_S = 5.0
"""After refusing a client's frame (1009 for one over the size limit, 1002, 1007), how long the server keeps reading
and discarding what the client is still sending before it closes the socket. Closing at once with the client's bytes
unread made the kernel reset the connection, and the client could lose the close frame and its code."""
_MAX_REQUEST_BYTES = 1 << 16
_HEAD16 = struct.Struct("!BBH")
_HEAD64 = struct.Struct("!BBQ")
UNMASK_IN_PLACE_BYTES = 1 << 16
"""A frame at least this large, held in the partial buffer, is unmasked there and decoded from it: no copy of the
payload (a 15 MB frame held three copies at once: the buffer, the unmasked bytes and the text)."""


def unmask_in_place(buffer: bytearray, start: int, end: int, mask: bytes) -> memoryview:
    """XOR ``buffer[start:end]`` with the 4-byte ``mask`` (RFC 6455 §5.3) where it lies; a view of the payload."""
    words = (end - start) // 4
    key = np.frombuffer(mask, dtype=np.uint32)[0]
    if words:
        np.bitwise_xor(np.frombuffer(buffer, dtype=np.uint32, count=words, offset=start), key,
                       out=np.frombuffer(buffer, dtype=np.uint32, count=words, offset=start))
    for i in range(start + 4 * words, end):
        buffer[i] ^= mask[(i - start) % 4]
    return memoryview(buffer)[start:end]


def _frame_limit(conn: Protocol) -> float:
    """The largest unfragmented frame websockets accepts (its message and fragment limits; None: no limit)."""
    limits = [x for x in (conn.max_message_size, conn.max_fragment_size) if x is not None]
    return min(limits) if limits else float("inf")


def _key(client: Any, server: Any) -> _Key | None:
    if not (isinstance(client, (tuple, list)) and isinstance(server, (tuple, list))):
        return None
    if len(client) < 2 or len(server) < 2:
        return None
    return (str(client[0]), int(client[1]), str(server[0]), int(server[1]))


class AbortableWebSockets(WebSocketsSansIOProtocol):
    """uvicorn's default WebSocket protocol (with websockets installed, as it always is with us), findable from the
    ASGI scope, writing several texts at once and reading ahead a few messages."""

    receiver: Callable[[str | bytes], None] | None = None
    """Takes each client message instead of the ASGI queue while set (server/reader.py)."""
    written_bytes = 0
    """Bytes :meth:`write_texts` handed to the transport (the outbox's acknowledgement watch)."""
    read_bytes_per_s: float = INBOUND_BYTES_PER_S
    read_burst_bytes: float = INBOUND_BURST_BYTES
    refused = False
    """A client frame was refused and the socket is half-closed, discarding until the client closes: not to be
    reset (:meth:`handle_parser_exception`)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        self.voicechat_key = _key(transport.get_extra_info("peername"), transport.get_extra_info("sockname"))
        if self.voicechat_key is not None:
            _PROTOCOLS[self.voicechat_key] = self
        self._request_bytes: bytearray | None = bytearray()  # until the opening request is parsed
        self._frames: bytearray | None = None  # our framing: the partial frame after the last whole one
        self._needed = 2  # the bytes the partial frame needs before parsing it again gets further
        super().connection_made(transport)
        self.transport = GatedReading(self.transport, self.loop)  # type: ignore[assignment]
        self._budget = ByteBudget(self.read_bytes_per_s, self.read_burst_bytes, self.loop.time())

    def data_received(self, data: bytes) -> None:
        """Whole frames are found here (RFC 6455 §5.2). An unfragmented, masked text or binary frame without RSV bits
        goes straight to the ``receiver`` (~3 us a message less than websockets' parser and uvicorn's event
        dispatch); a control frame goes, whole, to websockets, whose parser therefore waits at a frame boundary
        between frames. Framing starts right after the opening request when nothing followed it (a client may send
        frames only once it has the 101); anything else (a fragment, an extension, an unmasked or oversized frame, an
        unknown opcode) hands websockets everything from that frame on, to judge as it always has. Every byte is
        charged to the socket's read budget first (server/reading.py)."""
        wait = self._budget.spend(len(data), self.loop.time())
        if wait > 0.0:
            self.transport.hold(wait)  # type: ignore[attr-defined]
        frames = self._frames
        if frames is None:
            request = self._request_bytes
            super().data_received(data)
            if request is not None:
                request += data
                if self.handshake_initiated:
                    self._request_bytes = None
                    if request.find(b"\r\n\r\n") + 4 == len(request) and not self.conn.reader.buffer:
                        self._frames = bytearray()
                        self._frame_limit = _frame_limit(self.conn)
                elif len(request) > _MAX_REQUEST_BYTES:
                    self._request_bytes = None  # websockets refuses it; never ours
            return
        if frames:  # a partial frame waits: grow it in place, and parse only once the bytes it needs are here
            frames += data
            if len(frames) < self._needed:
                return
            buf: bytes | bytearray = frames
        else:
            buf = data
        view = memoryview(buf)
        n = len(view)
        pos = 0
        needed = 2  # how many bytes from ``pos`` the next frame needs before it can be parsed further
        conn = self.conn
        while n - pos >= 2:
            b0, b1 = view[pos], view[pos + 1]
            control = 0x88 <= b0 <= 0x8A  # close, ping, pong
            if (b0 != 0x81 and b0 != 0x82 and not control) or not b1 & 0x80 or conn.extensions:
                return self._hand_over(view, pos)
            length = b1 & 0x7F
            size_end = pos + (4 if length == 126 else 10 if length == 127 else 2)
            if size_end > n:
                needed = size_end - pos
                break
            if length >= 126:
                length = int.from_bytes(view[pos + 2 : size_end], "big")
            if length > self._frame_limit:  # websockets closes with 1009
                return self._hand_over(view, pos)
            head = size_end + 4  # the mask
            end = head + length
            if end > n:
                needed = end - pos
                break
            receiver = self.receiver
            if not control and receiver is not None and not self.close_sent and conn.state is State.OPEN:
                if buf is frames and length >= UNMASK_IN_PLACE_BYTES:
                    mask = bytes(view[size_end:head])
                    payload = unmask_in_place(frames, head, end, mask)  # writes the buffer; no resize
                    try:
                        message: bytes | str = bytes(payload) if b0 == 0x82 else str(payload, "utf-8")
                    except UnicodeDecodeError:
                        unmask_in_place(frames, head, end, mask).release()  # masked again, for websockets
                    else:
                        payload.release()
                        receiver(message)
                        pos = end
                        continue
                    payload.release()
                else:
                    payload = apply_mask(view[head:end], view[size_end:head])
                    if b0 == 0x82:
                        receiver(payload)
                        pos = end
                        continue
                    try:
                        text = payload.decode()
                    except UnicodeDecodeError:
                        pass  # websockets' and uvicorn's path closes with 1007
                    else:
                        receiver(text)
                        pos = end
                        continue
            super().data_received(bytes(view[pos:end]))
            pos = end
        view.release()
        if self._frames is None:
            return
        if buf is frames:
            del frames[:pos]  # the partial frame moves to the front once, not on every read
        else:
            self._frames = bytearray(data[pos:])
        self._needed = needed if pos < n else 2

    def limit_messages(self, max_bytes: int) -> None:
        """Take no client message over ``max_bytes`` from now on (never more than the server's ``ws_max_size``): a
        larger frame is refused while its header arrives, before it is buffered, and websockets closes with 1009."""
        conn = self.conn
        if not hasattr(self, "_server_max_message_size"):
            self._server_max_message_size = conn.max_message_size
        ceiling = self._server_max_message_size
        conn.max_message_size = max_bytes if ceiling is None else min(max_bytes, ceiling)
        self._frame_limit = _frame_limit(conn)  # what our framing hands to websockets to refuse

    def _hand_over(self, view: memoryview, pos: int) -> None:
        """From the frame at ``pos`` on, websockets reads everything (its parser waits at that frame's start)."""
        self._frames = None
        rest = bytes(view[pos:])
        view.release()
        super().data_received(rest)

    def handle_parser_exception(self) -> None:
        """websockets failed the connection on a frame it refused (its close frame is queued, then the end of our
        writing). uvicorn wrote the close and closed the socket at once, so a client still sending (the rest of an
        oversized frame) got a reset and could lose the close frame; here the socket is half-closed instead and
        what the client still sends is discarded (websockets' parser does) until it closes (the transport closes on
        its end of file), at most ``CLOSE_LINGER_S``."""
        if self.close_sent:
            return  # already lingering: the discarded bytes of a failed connection
        assert self.conn.close_sent is not None
        self.queue.put_nowait({"type": "websocket.disconnect", "code": self.conn.close_sent.code,
                               "reason": self.conn.close_sent.reason})
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        try:
            half_close = self.transport.can_write_eof()
        except NotImplementedError:
            half_close = False
        if not half_close:
            self.transport.close()
            return
        self.transport.write_eof()
        self.refused = True
        # uvicorn's timer for a closing handshake: the app's end and connection_lost leave the close to it
        self.close_timer = self.loop.call_later(CLOSE_LINGER_S, self.transport.close)

    def drop(self) -> None:
        """Drop the TCP connection now (a reset: nothing queued can reach a client that left), unless a refused
        frame's close is lingering: that socket closes once the client has read its close."""
        if not self.refused:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.voicechat_key is not None:
            _PROTOCOLS.pop(self.voicechat_key, None)
        self.transport.cancel_hold()  # type: ignore[attr-defined]
        super().connection_lost(exc)
        release_parser(self.conn)

    def write_texts(self, texts: Sequence[str | bytes]) -> None:
        """Frame each text (a ``str``, or its UTF-8 as ``bytes``) as a WebSocket message and hand them all to the
        transport in one write. Raises ``ConnectionError`` once the connection is closing or gone (websockets'
        ``InvalidState`` included)."""
        if self.disconnected or self.close_sent or not self.handshake_complete:
            raise ConnectionError("the WebSocket is not open")
        conn = self.conn
        if conn.state is State.OPEN and not conn.extensions and not conn.expect_continuation_frame:
            # An unmasked, unfragmented text frame without extensions is a 2-10 byte header (RFC 6455 §5.2): framed
            # here, after whatever websockets itself has queued (a pong), ~2 us an event less than send_text.
            parts = conn.data_to_send()
            for text in texts:
                data = text if type(text) is bytes else text.encode()
                n = len(data)
                parts.append(bytes((0x81, n)) if n < 126 else _HEAD16.pack(0x81, 126, n) if n < 65536
                             else _HEAD64.pack(0x81, 127, n))
                parts.append(data)
            data = b"".join(parts)
            self.written_bytes += len(data)
            self.transport.write(data)
            return
        try:
            for text in texts:
                conn.send_text(text if type(text) is bytes else text.encode())
        except Exception as exc:  # InvalidState: the peer's close arrived
            raise ConnectionError(str(exc)) from exc
        data = b"".join(conn.data_to_send())
        self.written_bytes += len(data)
        self.transport.write(data)

    def send_receive_event_to_app(self) -> None:
        receiver = self.receiver
        if receiver is not None and not self.close_sent:
            data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
            if self.curr_msg_data_type == "text":
                try:
                    text = data.decode()
                except UnicodeDecodeError:
                    pass  # uvicorn's own path closes with 1007
                else:
                    self.frames = []
                    receiver(text)
                    return
            else:
                self.frames = []
                receiver(data)
                return
        # uvicorn pauses reading after every message (it skips that while already paused) and resumes when the app
        # has taken them all; we pause only at READ_AHEAD_MESSAGES, or after a message of READ_AHEAD_BYTES (16 large
        # messages would be 256 MiB waiting), and uvicorn's receive resumes as before.
        size = sum(len(f) for f in self.frames)
        paused, self.read_paused = self.read_paused, True
        try:
            super().send_receive_event_to_app()
        finally:
            self.read_paused = paused
        if not paused and (self.queue.qsize() >= READ_AHEAD_MESSAGES or size >= READ_AHEAD_BYTES):
            self.read_paused = True
            self.transport.pause_reading()


_PROTOCOLS: dict[_Key, AbortableWebSockets] = {}


class HeadTimedH11(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose first request head has not arrived within
    ``head_timeout_s`` of its accept. uvicorn times only the wait between keep-alive requests, and any byte resets
    that timer, so a connection that never sends a request (or sends it a byte at a time) stayed open for ever."""

    head_timeout_s = REQUEST_HEAD_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = self.loop.call_later(self.head_timeout_s, self._head_overdue)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_timer is not None and (self.cycle is not None or self.transport.get_protocol() is not self):
            self._head_timer.cancel()  # a request (or a WebSocket upgrade) arrived in time
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self.cycle is None and self.transport.get_protocol() is self and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)


def release_parser(conn: ServerProtocol) -> None:
    """websockets' parser is a generator whose frame holds its protocol, and the errors it failed on (a frame's, the
    opening request's) keep tracebacks through that frame: cycles only a full collection frees, and ours are rare
    (server/heap.py). Once the connection is lost nothing is parsed, so all are let go."""
    conn.parser.close()
    for failure in (conn.parser_exc, conn.handshake_exc):
        for exc in (failure, failure and failure.__cause__, failure and failure.__context__):
            if exc is not None:
                exc.__traceback__ = None


def protocol_for(websocket: Any) -> AbortableWebSockets | None:
    """Our protocol serving a Starlette WebSocket, when :class:`AbortableWebSockets` serves it, else None."""
    scope = websocket.scope
    key = _key(scope.get("client"), scope.get("server"))
    return _PROTOCOLS.get(key) if key is not None else None


def limit_messages(websocket: Any, max_bytes: int) -> bool:
    """Set the largest client message a Starlette WebSocket takes from now on, where our protocol serves it (False
    elsewhere: the host checks each message it is handed instead)."""
    protocol = protocol_for(websocket)
    if protocol is None:
        return False
    protocol.limit_messages(max_bytes)
    return True


def transport_for(websocket: Any) -> Any:
    """The asyncio transport of a Starlette WebSocket served by :class:`AbortableWebSockets`, else None."""
    protocol = protocol_for(websocket)
    return protocol.transport if protocol is not None else None


def uvicorn_config(app: Any, *, request_head_timeout_s: float = REQUEST_HEAD_TIMEOUT_S,
                   **kwargs: Any) -> uvicorn.Config:
    """uvicorn's config for our app: protocol-level pings off (long model steps or slow consumers must never trip a
    transport timer), permessage-deflate off unless asked for (base64 audio barely compresses, and compressing
    every event cost ~12 % of the server's CPU; a client that offers it still connects, uncompressed), our
    WebSocket protocol, and h11 with a deadline for the first request head (:class:`HeadTimedH11`)."""
    kwargs.setdefault("ws_ping_interval", None)
    kwargs.setdefault("ws_ping_timeout", None)
    kwargs.setdefault("ws_per_message_deflate", False)
    kwargs.setdefault("ws", AbortableWebSockets)
    kwargs.setdefault("http", type("HeadTimedH11", (HeadTimedH11,), {"head_timeout_s": request_head_timeout_s}))
    return uvicorn.Config(app, **kwargs)


class VoicechatUvicornServer(uvicorn.Server):
    """uvicorn's server, ending our sessions first when it shuts down (``VoicechatServer.end_all_sessions``)."""

    def __init__(self, config: uvicorn.Config, voicechat: Any) -> None:
        if config.ws == "auto":
            config.ws = AbortableWebSockets
        super().__init__(config)
        self.voicechat = voicechat
        self.drain_requested = False

    def handle_exit(self, sig: int, frame: Any) -> None:
        """A replica's first SIGTERM drains it (a rolling restart: no new sessions, the process ends when its
        sessions have); a second, or SIGINT, stops it now. A lone server stops at once, as uvicorn does."""
        if (sig == signal.SIGTERM and self.voicechat.config.replica is not None and not self.drain_requested
                and not self.should_exit):
            self.drain_requested = True  # acted on in on_tick, on the loop (this runs in a signal handler)
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_requested:
            self.voicechat.drain()
            if self.voicechat.admission.active == 0:
                self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: Any = None) -> None:
        self.voicechat.host.end_all_sessions()
        await super().shutdown(sockets=sockets)
