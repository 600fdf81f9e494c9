"""One socket's bounded outbound queue and its writer task (docs/reliability.md, "Backpressure")."""

from __future__ import annotations

import asyncio
import contextlib
from array import array
from collections import deque
from collections.abc import Callable
from typing import Any

from starlette.websockets import WebSocket

from ..shell.turn_end import turn_end
from ..trace.tap import Trace, traced
from .acks import AckWatch, unacked_bytes
from .config import ServerConfig
from .uvicorn import AbortableWebSockets, protocol_for

ACK_CHECK_S = 5.0
"""How often the peer's acknowledgements are looked at (at most; a quarter of the stall timeout when that is shorter)."""
BATCH_EVENTS = 64
BATCH_BYTES = 1 << 20
"""At most this many events / bytes in one transport write (a position's events are a few small ones), or one
backlog (below) whole."""
BACKLOG_AFTER = 64
"""Events queued beyond this many entries (a transport that does not keep up) are kept in backlogs: the UTF-8 of many
events in one buffer, not a string each. A reader that stops leaves up to ``max_outbound_bytes`` queued; as tens of
thousands of small strings that spread over the allocator's arenas, and the odd long-lived object allocated among them
keeps those arenas from the OS after the session has ended."""
BACKLOG_BYTES = 64 << 10
"""The most UTF-8 one backlog holds."""


class _Backlog:
    """Queued events' UTF-8, in order, in one buffer (see ``BACKLOG_AFTER``)."""

    __slots__ = ("data", "ends")

    def __init__(self) -> None:
        self.data = bytearray()
        self.ends = array("I")

    def add(self, text: str) -> None:
        self.data += text.encode()
        self.ends.append(len(self.data))

    def payloads(self) -> list[bytes]:
        data, start, out = self.data, 0, []
        for end in self.ends:
            out.append(bytes(data[start:end]))
            start = end
        return out


_Entry = tuple[str | _Backlog, int, int, bool]
"""(an event's text or a backlog, its UTF-8 bytes, its events, forced)"""


class Outbox:
    """One socket's bounded outbound queue and its writer task (docs/reliability.md, "Backpressure").

    Sessions hand events over without waiting on the network, so a slow reader never stalls a session's model
    clock. Events queued or being written count against ``max_bytes``/``max_events``; the first event that would
    exceed either is not queued and ``on_overflow`` runs once (the owner's policy). ``on_gone`` runs when a write
    fails (the client left); it is handed the outbox, so that neither callback need refer to it (no cycle).

    On our uvicorn protocol every event queued when the writer wakes goes out in one transport write (a position's
    events are queued together, so one write per position); elsewhere one ASGI send per event."""

    def __init__(self, websocket: WebSocket, config: ServerConfig, *, on_overflow: Callable[[], None],
                 on_gone: Callable[[Outbox], None]) -> None:
        self.websocket = websocket
        self.max_bytes = config.max_outbound_bytes
        self.max_events = config.max_outbound_events
        self.close_timeout_s = config.outbound_close_timeout_s
        self.stall_timeout_s = config.outbound_stall_timeout_s
        self.stalled = False
        """The transport took nothing for ``stall_timeout_s`` while events waited (the policy ran)."""
        self._on_overflow = on_overflow
        self._on_gone = on_gone
        self._queue: deque[_Entry] = deque()
        self.queued_bytes = 0
        self._events = 0
        self._forced_bytes = 0  # forced events (a replay, a fatal error) do not count against the bounds
        self._forced_events = 0
        self.peak_bytes = 0
        self.peak_events = 0
        self.sent_events = 0
        self.overflowed = False
        self.gone = False
        self._closing: tuple[int, str] | None = None
        self._wake = asyncio.Event()
        self._progress = 0
        self._direct = protocol_for(websocket)
        self._trace = traced(websocket) if self._direct is not None else None  # (the ASGI tap sees the other path)
        self._flush_due = False
        self._loop = asyncio.get_running_loop()
        self._turn_end = turn_end(self._loop)
        self._task = asyncio.create_task(self._write())
        # Our protocol's socket: a peer that acknowledges nothing for the stall timeout while bytes wait has stopped
        # reading, whether or not the kernel's send buffer is full yet.
        self._acks: AckWatch | None = None
        self._ack_timer: asyncio.TimerHandle | None = None
        if self._direct is not None and self.stall_timeout_s is not None:
            self._acks = AckWatch(self.stall_timeout_s, self._loop.time())
            self._ack_every = min(ACK_CHECK_S, self.stall_timeout_s / 4)
            self._ack_timer = self._loop.call_later(self._ack_every, self._check_acks)

    @property
    def queued_events(self) -> int:
        return self._events

    def put(self, text: str, *, force: bool = False) -> bool:
        """Queue one event; False when it was not queued (overflow now or before, closing, or gone). A forced
        event is exempt from the bounds: a resume's replay (bounded by the journal), ``session.replaced``, a fatal
        error after a discard."""
        if self.gone or self._closing is not None or (self.overflowed and not force):
            return False
        size = len(text) if text.isascii() else len(text.encode())  # its UTF-8 bytes
        events, queued = self._events - self._forced_events, self.queued_bytes - self._forced_bytes  # the bounded
        if force:
            self._forced_bytes += size
            self._forced_events += 1
        elif events and (events >= self.max_events or queued + size > self.max_bytes):
            self.overflowed = True
            self._on_overflow()
            return False
        queue = self._queue
        if len(queue) >= BACKLOG_AFTER and not force and self._direct is not None:
            item, n, held, forced = queue[-1]
            if type(item) is _Backlog and not forced and n + size <= BACKLOG_BYTES:
                queue.pop()
            else:
                item, n, held = _Backlog(), 0, 0
            item.add(text)
            queue.append((item, n + size, held + 1, False))
        else:
            queue.append((text, size, 1, force))
        self._events += 1
        self.queued_bytes += size
        if not force:  # a forced event leaves what counts against the bounds, and so the peaks, as they were
            if queued + size > self.peak_bytes:
                self.peak_bytes = queued + size
            if events >= self.peak_events:
                self.peak_events = events + 1
        if self._direct is None:
            self._wake.set()
        elif not self._flush_due:
            # Written once this loop iteration's callbacks have run: a position's events queue together and go out
            # in one write, without waking the writer task (which only waits out a full transport buffer).
            self._flush_due = True
            self._turn_end.call(self._flush)
        return True

    def _flush(self) -> None:
        self._flush_due = False
        direct = self._direct
        if self.gone or self._task.done() or direct is None:
            return
        try:
            while self._queue:
                if not direct.writable.is_set():
                    self._wake.set()  # the writer task waits for the transport to drain
                    return
                self._write_batch(direct, self._trace)  # at most BATCH_EVENTS / BATCH_BYTES a write
        except Exception:  # the client left: a write failure is a disconnect
            self._lost()

    def discard(self) -> None:
        """Drop what is queued (the event being written stays: it is half in the transport)."""
        keep = [self._queue[0]] if self._queue and not self._task.done() and type(self._queue[0][0]) is str else []
        self._clear()
        for entry in keep:
            self._queue.append(entry)
            self._count(entry, 1)

    def _count(self, entry: _Entry, sign: int) -> None:
        _, size, events, forced = entry
        self.queued_bytes += sign * size
        self._events += sign * events
        if forced:
            self._forced_bytes += sign * size
            self._forced_events += sign * events

    def _clear(self) -> None:
        self._queue.clear()
        self.queued_bytes = self._events = self._forced_bytes = self._forced_events = 0

    def close(self, code: int, reason: str = "") -> None:
        """Close the socket after what is queued has been written."""
        if self._closing is None:
            self._closing = (code, reason)
            self._wake.set()

    async def closed(self) -> None:
        """Wait for the close to be written; a writer making no progress for ``close_timeout_s`` is cut off and
        the transport aborted (a stalled reader never drains)."""
        while not self._task.done():
            seen = self._progress
            done, _ = await asyncio.wait({self._task}, timeout=self.close_timeout_s)
            if not done and self._progress == seen:
                self.abort()
        await asyncio.gather(self._task, return_exceptions=True)
        self._stop_watching()

    def abort(self) -> None:
        """Stop writing and drop the connection now."""
        self._stop_watching()
        self.gone = True
        self._clear()
        self._task.cancel()
        protocol = protocol_for(self.websocket)
        if protocol is not None:
            with contextlib.suppress(Exception):
                protocol.drop()

    async def _write(self) -> None:
        ws = self.websocket
        direct = self._direct
        try:
            while True:
                if not self._queue:
                    if self._closing is not None:
                        with contextlib.suppress(Exception):
                            await ws.close(*self._closing)
                        return
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if direct is not None:
                    await self._until_written(direct.writable.wait())  # the buffer is above its high-water mark
                    self._flush()  # what is queued now, in as few writes as the transport takes
                    if self.gone:
                        return
                    continue
                entry = self._queue[0]
                assert type(entry[0]) is str  # backlogs are our protocol's only
                await self._until_written(ws.send_text(entry[0]))
                self._progress += 1
                self.sent_events += 1
                if self._queue and self._queue[0] is entry:
                    self._count(self._queue.popleft(), -1)
        except asyncio.CancelledError:
            # Cancelled (an abort, the server's shutdown): the writer is done for good. Returning instead of
            # re-raising keeps the error, whose traceback holds this frame and so the outbox, out of the task: no
            # cycle outbox -> task -> error -> frame -> outbox for the collector to find.
            self.gone = True
        except Exception:  # the client left: a write failure is a disconnect
            self._lost()

    async def _until_written(self, waiting: Any) -> None:
        """Await a write (or the transport's room for one); if it takes nothing for ``stall_timeout_s``, the reader
        has stopped: the overflow policy runs once, and the wait goes on (a close or an abort ends it). A timer, not
        a task around the write: the write is awaited in place (a task per event cost ~16 us, a timer ~2)."""
        if self.stall_timeout_s is None or self.overflowed:
            await waiting
            return
        timer = asyncio.get_running_loop().call_later(self.stall_timeout_s, self._stalled)
        try:
            await waiting
        finally:
            timer.cancel()

    def _check_acks(self) -> None:
        self._ack_timer = None
        direct, acks = self._direct, self._acks
        if self.gone or self.overflowed or self._task.done() or direct is None or acks is None:
            return
        transport = direct.transport
        unacked = unacked_bytes(transport.get_extra_info("socket"))
        if unacked is None:
            return  # the kernel cannot say: the transport's own stall timer stands alone
        if acks.stalled(self._loop.time(), written=direct.written_bytes, buffered=transport.get_write_buffer_size(),
                        unacked=unacked, queued=self.queued_bytes):
            self._stalled()
            return
        self._ack_timer = self._loop.call_later(self._ack_every, self._check_acks)

    def _stop_watching(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None

    def _stalled(self) -> None:
        if not self.overflowed:
            self.stalled = self.overflowed = True
            self._on_overflow()

    def _lost(self) -> None:
        self._stop_watching()
        self.gone = True
        self._clear()
        # The writer would wait for events forever: a pending task whose frame holds this outbox and its socket
        # until the collector's backstop (a write that failed outside the task, in _flush, left it waiting)
        self._task.cancel()
        self._on_gone(self)

    def _write_batch(self, direct: AbortableWebSockets, trace: Trace | None) -> None:
        """Write the events at the head of the queue in one transport write, then drop them from the queue (no
        await in between: nothing else can touch the queue)."""
        texts: list[str | bytes] = []
        size = entries = 0
        for item, n, _, _ in self._queue:
            if texts and (len(texts) >= BATCH_EVENTS or size + n > BATCH_BYTES):
                break
            if type(item) is str:
                texts.append(item)
            else:
                texts += item.payloads()
            size += n
            entries += 1
        if trace is not None:
            for text in texts:
                trace.server_event(text if type(text) is str else text.decode())
        direct.write_texts(texts)
        queue = self._queue
        if entries == len(queue) and not self._forced_events:  # all of it (most writes): nothing left to count
            queue.clear()
            self.queued_bytes = self._events = 0
        else:
            for _ in range(entries):
                self._count(queue.popleft(), -1)
        self._progress += 1
        self.sent_events += len(texts)
