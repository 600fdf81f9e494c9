"""The ASGI app: ``/v1/voicechat`` speaks v3, ``/v1/duplex`` the tiered dialect, ``/v1/realtime`` either (chosen
per request, docs/tiered-dialect.md §1.1), ``/health`` reports readiness.

Each admitted connection gets its own session core, model instance and asyncio shell with a one-thread model
executor, so a slow or failing session never blocks another. Protocol rules live in the core and the wire
session; this module only moves frames and enforces admission.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from ..session.core import SessionConfig, SessionCore
from ..shell.aio import SessionShell
from ..trace.tap import tap_socket
from ..wire.tiered import parser as tiered_parser
from ..wire.tiered.connection import Detached, Outbound, TieredOptions, TieredSession
from ..wire.tiered.journal import compact_json
from ..wire.tiered.projector import error_event
from ..wire.tiered.routing import UnknownRoute, duplex_off_answer_text, select_route
from ..wire.tiered.schema import CLOSE_TRY_AGAIN_LATER
from ..wire.transport import CloseTransport
from ..wire.v3 import PROTOCOL, V3Options, V3Session
from ..wire.v3.schema import CLOSE_BUSY
from .admission import Admission
from .config import ServerConfig
from .warmup import WarmupReport, warm_up

log = logging.getLogger("vllm_omni_voicechat.server")


_dumps = compact_json  # one serialisation for both dialects (sent, sized and journaled alike)


def _text_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def asgi_transport(websocket: WebSocket) -> Any:
    """The asyncio transport under a Starlette WebSocket, or None. ASGI has no abort, and a graceful close waits
    on a reader that may never read, so the server reaches uvicorn's protocol object (whose ``send`` middleware
    may have wrapped in closures)."""
    todo, seen = [websocket._send], 0
    while todo and seen < 16:
        fn = todo.pop()
        seen += 1
        transport = getattr(getattr(fn, "__self__", None), "transport", None)
        if transport is not None and hasattr(transport, "abort"):
            return transport
        for cell in getattr(fn, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # an empty cell
                if callable(cell.cell_contents):
                    todo.append(cell.cell_contents)
    return None


def _abort_transport(websocket: WebSocket) -> None:
    """Drop the TCP connection at once (RST)."""
    transport = asgi_transport(websocket)
    if transport is not None:
        transport.abort()


class _Outbox:
    """One socket's bounded outbound queue and its writer task (docs/reliability.md, "Backpressure").

    Sessions hand events over without waiting on the network, so a slow reader never stalls a session's model
    clock. Events queued or being written count against ``max_bytes``/``max_events``; the first event that would
    exceed either is not queued and ``on_overflow`` runs once (the owner's policy). ``on_gone`` runs when a write
    fails (the client left)."""

    def __init__(self, websocket: WebSocket, config: ServerConfig, *, on_overflow: Callable[[], None],
                 on_gone: Callable[[], None]) -> None:
        self.websocket = websocket
        self.max_bytes = config.max_outbound_bytes
        self.max_events = config.max_outbound_events
        self.close_timeout_s = config.outbound_close_timeout_s
        self._on_overflow = on_overflow
        self._on_gone = on_gone
        self._queue: deque[tuple[str, int, bool]] = deque()  # (text, size, forced)
        self.queued_bytes = 0
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
        self._task = asyncio.create_task(self._write())

    @property
    def queued_events(self) -> int:
        return len(self._queue)

    def put(self, text: str, *, force: bool = False) -> bool:
        """Queue one event; False when it was not queued (overflow now or before, closing, or gone). A forced
        event is exempt from the bounds: a resume's replay (bounded by the journal), ``session.replaced``, a fatal
        error after a discard."""
        if self.gone or self._closing is not None or (self.overflowed and not force):
            return False
        size = _text_size(text)
        if force:
            self._forced_bytes += size
            self._forced_events += 1
        else:
            events, queued = len(self._queue) - self._forced_events, self.queued_bytes - self._forced_bytes
            if events and (events >= self.max_events or queued + size > self.max_bytes):
                self.overflowed = True
                self._on_overflow()
                return False
        self._queue.append((text, size, force))
        self.queued_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.queued_bytes - self._forced_bytes)
        self.peak_events = max(self.peak_events, len(self._queue) - self._forced_events)
        self._wake.set()
        return True

    def discard(self) -> None:
        """Drop what is queued (the event being written stays: it is half in the transport)."""
        keep = [self._queue[0]] if self._queue and not self._task.done() else []
        self._clear()
        for entry in keep:
            self._queue.append(entry)
            self._count(entry, 1)

    def _count(self, entry: tuple[str, int, bool], sign: int) -> None:
        _, size, forced = entry
        self.queued_bytes += sign * size
        if forced:
            self._forced_bytes += sign * size
            self._forced_events += sign

    def _clear(self) -> None:
        self._queue.clear()
        self.queued_bytes = self._forced_bytes = self._forced_events = 0

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

    def abort(self) -> None:
        """Stop writing and drop the connection now."""
        self.gone = True
        self._clear()
        self._task.cancel()
        with contextlib.suppress(Exception):
            _abort_transport(self.websocket)

    async def _write(self) -> None:
        ws = self.websocket
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
                entry = self._queue[0]
                await ws.send_text(entry[0])
                self._progress += 1
                self.sent_events += 1
                if self._queue and self._queue[0] is entry:
                    self._count(self._queue.popleft(), -1)
        except asyncio.CancelledError:
            raise
        except Exception:  # the client left: a write failure is a disconnect
            self.gone = True
            self._clear()
            self._on_gone()


class _Attachment:
    """A tiered session and the socket it is attached to (None while detached), with that socket's outbox. Puts
    never wait, so a resume's replay and live events never interleave; ``sent_through`` drops live events a
    replay already carried."""

    def __init__(self, protocol: TieredSession, config: ServerConfig) -> None:
        self.protocol = protocol
        self.config = config
        self.shell: SessionShell | None = None
        self.socket: WebSocket | None = None
        self.outbox: _Outbox | None = None
        self.lock = asyncio.Lock()
        self.sent_through = 0
        self.close_code: int | None = None
        self.ended = asyncio.Event()
        self.detached_overflows = 0
        self.peak_outbound_bytes = 0
        self.peak_outbound_events = 0
        self._closers: set[asyncio.Task] = set()

    def attach(self, ws: WebSocket, *, resume_outputs: int = 0) -> _Outbox:
        """Make ``ws`` the current socket, with a fresh outbox; the previous one (if any) is left to the caller.
        A resumed socket whose ``resume_outputs`` (``session.resumed`` + replay) are not all written when it fails
        rolls the credential back: the client may never have seen the new token."""

        def gone() -> None:
            if self.socket is ws and outbox.sent_events < resume_outputs:
                self.protocol.rollback_resume()
            self.detach(ws)

        outbox = _Outbox(ws, self.config, on_overflow=lambda: self._overflow(ws), on_gone=gone)
        self.socket, self.outbox = ws, outbox
        return outbox

    def _overflow(self, ws: WebSocket) -> None:
        # Policy (tiered): a socket that cannot keep up is detached like a dropped one; the session lives on in
        # the journal and the client resumes within the grace.
        if self.socket is not ws:
            return
        self.detached_overflows += 1
        outbox = self.outbox
        self.detach(ws)
        if outbox is not None:
            outbox.abort()

    def retire(self, outbox: _Outbox | None, code: int, reason: str = "") -> None:
        """Close a socket that is no longer current, in the background (a stalled one is cut off)."""
        if outbox is None:
            return
        outbox.close(code, reason)
        task = asyncio.create_task(outbox.closed())
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)

    def send(self, item: Outbound) -> None:
        outbox = self.outbox
        if self.socket is None or outbox is None or (item.seq is not None and item.seq <= self.sent_through):
            return  # detached (the journal keeps it) or already replayed on this socket
        if not outbox.put(item.text):
            return  # overflow (the socket is detached now) or the client left
        self.peak_outbound_bytes = max(self.peak_outbound_bytes, outbox.peak_bytes)
        self.peak_outbound_events = max(self.peak_outbound_events, outbox.peak_events)
        if item.seq is not None:
            self.sent_through = item.seq

    def detach(self, ws: WebSocket) -> None:
        if self.socket is not ws:
            return  # a superseded socket going away changes nothing
        self.socket = None
        self.outbox = None
        if self.protocol.resumable:
            # Set at once, on the loop: a resume arriving before the shell's next turn sees the session detached.
            self.protocol.detach(time.monotonic())
            if self.shell is not None:
                self.shell.submit(Detached(self.protocol.credential.generation))  # type: ignore[arg-type]
        elif self.shell is not None:
            self.shell.disconnect()


def _backpressure_stats(dialect: str, session_id: str, shell: SessionShell, peak_bytes: int, peak_events: int,
                        overflows: int) -> dict[str, Any]:
    return {"dialect": dialect, "session_id": session_id, "peak_outbound_bytes": peak_bytes,
            "peak_outbound_events": peak_events, "outbound_overflows": overflows,
            "peak_inbox_messages": shell.peak_inbox_messages, "peak_inbox_bytes": shell.peak_inbox_bytes,
            "refused_messages": shell.refused}


class VoicechatServer:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.admission = Admission(config.max_sessions)
        self.started_at = time.monotonic()
        self.sessions: dict[str, SessionShell] = {}
        self.cleanup_failure: str | None = None  # set when a session's model abort failed: new sessions refused
        self.tiered: dict[str, _Attachment] = {}  # live and detached tiered sessions, for session.resume
        self.warmup: WarmupReport | None = None
        self.backpressure: deque[dict[str, Any]] = deque(maxlen=256)  # the last ended sessions (benchmarks, tests)
        self._v3_outboxes: dict[str, _Outbox] = {}

    def outbox(self, session_id: str) -> _Outbox | None:
        """The outbound queue of a live session's current socket (benchmarks, tests)."""
        att = self.tiered.get(session_id)
        return att.outbox if att is not None else self._v3_outboxes.get(session_id)

    def end_all_sessions(self) -> None:
        """Server shutdown: end every session now, on the server's loop. A detached tiered session would otherwise
        wait out its disconnect grace in its ASGI task, and uvicorn's graceful shutdown waits for that task."""
        for shell in list(self.sessions.values()):
            shell.disconnect()

    @property
    def typed_ready(self) -> bool:
        synth = self.config.synthesizer
        return bool(synth is not None and synth.ready)

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "status": "degraded" if self.cleanup_failure else "ready",
                "model": "cleanup_failed" if self.cleanup_failure else "ready",
                **({"model_cleanup_failure": self.cleanup_failure} if self.cleanup_failure else {}),
                "model_kind": self.config.model_kind,
                "protocol": dict(PROTOCOL),
                "auth_required": False,
                "active_sessions": self.admission.active,
                "max_sessions": self.admission.capacity,
                "active_client": self.admission.active > 0,
                "typed_input": {
                    "ready": self.typed_ready,
                    "synthesizer": getattr(self.config.synthesizer, "name", None),
                },
                "checkpoint": {"model": self.config.model_kind},
                "host_runtime": "cpu-simulator" if self.config.model_kind == "simulator" else "vllm-omni",
                "uptime_seconds": round(time.monotonic() - self.started_at, 3),
                "warmup": None if self.warmup is None else {"positions": self.warmup.positions,
                                                             "seconds": self.warmup.seconds},
            }
        )

    async def v3(self, websocket: WebSocket) -> None:
        tap_socket(websocket, self.config.trace_factory, "v3")  # tests: every frame through the trace checker
        await websocket.accept()
        if not self.admission.try_acquire():
            session_id = str(uuid.uuid4())
            busy = {
                "type": "error",
                "event_id": f"evt_{session_id}_1",
                "session_id": session_id,
                "error": {"code": "server_busy", "message": "all session slots are in use", "fatal": True},
            }
            try:
                await websocket.send_text(_dumps(busy))
                await websocket.close(CLOSE_BUSY)
            except Exception:  # the client left first
                pass
            return
        try:
            await self._run_v3(websocket)
        finally:
            self.admission.release()

    async def _run_v3(self, websocket: WebSocket) -> None:
        cfg = self.config
        core = SessionCore(
            SessionConfig(
                settlement_blank_frames=cfg.settlement_blank_frames,
                max_session_model_frames=cfg.max_session_model_frames,
                typed_input_ready=self.typed_ready,
                function_call_timeout_s=cfg.function_call_timeout_s,
                function_recovery_max_frames=cfg.function_recovery_max_frames,
            )
        )
        protocol = V3Session(
            core, V3Options(default_instructions=cfg.default_instructions, single_client=cfg.max_sessions == 1)
        )
        close_code: int | None = None
        gone = False
        shell: SessionShell | None = None

        def left() -> None:
            nonlocal gone
            gone = True
            if shell is not None:
                shell.disconnect()

        def overflow() -> None:
            # Policy (v3): a reader this far behind fails its session: the model is released (a silent
            # teardown), then the fatal output_backpressure error and close 1011 go out after a discard.
            left()

        outbox = _Outbox(websocket, cfg, on_overflow=overflow, on_gone=left)

        async def sink(item: Any) -> None:
            nonlocal close_code
            if isinstance(item, CloseTransport):
                close_code = item.code
            elif not gone:
                outbox.put(_dumps(item))

        def refuse(event_id: Any, now: float) -> list[Any]:
            return [protocol.projector.error("input_backpressure", "the receive queue is full; event refused",
                                             False, event_id, limit=cfg.max_inbox_messages)]

        for item in protocol.start(time.monotonic()):
            await sink(item)
        if self.cleanup_failure is not None:
            # A poisoned model home: greet, then fail the session before it can touch the model.
            for item in protocol.poisoned(self.cleanup_failure, time.monotonic()):
                await sink(item)
            outbox.close(close_code or 1011)
            await outbox.closed()
            return
        shell = SessionShell(protocol, cfg.model_factory(), sink, synthesizer=cfg.synthesizer,
                             max_inbox_messages=cfg.max_inbox_messages, max_inbox_bytes=cfg.max_inbox_bytes,
                             refuse=refuse)
        self.sessions[core.session_id] = shell
        self._v3_outboxes[core.session_id] = outbox

        async def read() -> None:
            try:
                while True:
                    message = await websocket.receive()
                    if message["type"] == "websocket.disconnect":
                        break
                    data = message.get("text") if message.get("text") is not None else message.get("bytes")
                    if data is not None:
                        await shell.offer(data)
            except Exception:  # a transport error is a disconnect like any other, never a session left hanging
                log.debug("session %s: reader failed", core.session_id, exc_info=True)
            left()

        reader = asyncio.create_task(read())
        try:
            await shell.run()
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            self.sessions.pop(core.session_id, None)
            self._v3_outboxes.pop(core.session_id, None)
            if shell.cleanup_error is not None:
                self.cleanup_failure = f"model abort failed: {shell.cleanup_error}"
                log.error("session %s: %s; refusing new sessions", core.session_id, self.cleanup_failure)
        if outbox.overflowed and not outbox.gone:
            outbox.discard()
            outbox.put(_dumps(protocol.projector.error(
                "output_backpressure", "the client is not reading server events fast enough", True,
                peak_queued_bytes=outbox.peak_bytes, max_outbound_bytes=outbox.max_bytes,
                max_outbound_events=outbox.max_events)), force=True)
            outbox.close(1011)
        elif not gone:
            outbox.close(close_code or 1000)
        else:
            outbox.abort()
        await outbox.closed()
        self.backpressure.append(_backpressure_stats("v3", core.session_id, shell, outbox.peak_bytes,
                                                     outbox.peak_events, int(outbox.overflowed)))


    # ================================================================ the tiered dialect

    async def realtime(self, websocket: WebSocket) -> None:
        try:
            route = select_route(
                websocket.url.path,
                dict(websocket.query_params),
                dict(websocket.headers),
                bare_default=self.config.realtime_default,
            )
        except UnknownRoute:
            await websocket.close(1008)
            return
        if route.dialect == "v3":
            await self.v3(websocket)
            return
        tap_socket(websocket, self.config.trace_factory, "tiered-openai" if route.lane == "openai" else "tiered")
        await websocket.accept()
        if route.dialect == "duplex_off":
            await self._answer(websocket, duplex_off_answer_text(), 1000)
            return
        first: str | bytes | None = None
        if not route.autostart:
            try:
                message = await asyncio.wait_for(websocket.receive(), self.config.handshake_timeout_s)
            except TimeoutError:
                await self._answer(websocket, _dumps(self._error("config_timeout", "no first message in time")), 1000)
                return
            if message["type"] == "websocket.disconnect":
                return
            first = message.get("text") if message.get("text") is not None else message.get("bytes")
            parsed = tiered_parser.parse(first or "")
            if isinstance(parsed, tiered_parser.SessionResume):
                await self._resume(websocket, parsed)
                return
            if isinstance(parsed, tiered_parser.ParseError) and parsed.code == "invalid_session_resume":
                err = self._error(parsed.code, parsed.message, event_id=parsed.event_id, param=parsed.param)
                await self._answer(websocket, _dumps(err), 1000)
                return
        if not self.admission.try_acquire():
            limit = self.admission.capacity
            err = self._error("resource_exhausted", f"duplex_session_capacity_exhausted: limit={limit}", retryable=True)
            await self._answer(websocket, _dumps(err), CLOSE_TRY_AGAIN_LATER)
            return
        try:
            await self._run_tiered(websocket, route, first)
        finally:
            self.admission.release()

    @staticmethod
    def _error(code: str, message: str, **kw: Any) -> dict[str, Any]:
        return {"type": "error", "event_id": f"event_{uuid.uuid4().hex[:12]}", **{
            k: v for k, v in error_event(code, message, **kw).items() if k != "type"}}

    @staticmethod
    async def _answer(websocket: WebSocket, text: str, code: int) -> None:
        try:
            await websocket.send_text(text)
            await websocket.close(code)
        except Exception:  # the client left first
            pass

    async def _run_tiered(self, websocket: WebSocket, route: Any, first: str | bytes | None) -> None:
        cfg = self.config
        core = SessionCore(
            SessionConfig(
                session_id=f"duplex-{uuid.uuid4().hex}",
                settlement_blank_frames=cfg.settlement_blank_frames,
                max_session_model_frames=cfg.max_session_model_frames,
                typed_input_ready=self.typed_ready,
                function_call_timeout_s=cfg.function_call_timeout_s,
                function_recovery_max_frames=cfg.function_recovery_max_frames,
                turn_policy="model",
                gate_open_after=1,
            )
        )
        protocol = TieredSession(
            core,
            TieredOptions(
                lane=route.lane,
                model=route.model,
                autostart=route.autostart,
                default_instructions=cfg.default_instructions,
                max_sessions=cfg.max_sessions,
                disconnect_grace_s=cfg.disconnect_grace_s,
                journal_max_bytes=cfg.journal_max_bytes,
                journal_ttl_s=cfg.journal_ttl_s,
            ),
        )
        att = _Attachment(protocol, cfg)
        first_outbox = att.attach(websocket)

        async def sink(item: Any) -> None:
            if isinstance(item, CloseTransport):
                att.close_code = item.code
            elif isinstance(item, Outbound):
                att.send(item)

        def refuse(event_id: Any, now: float) -> list[Any]:
            error = error_event("input_backpressure", "the receive queue is full; event refused", event_id=event_id,
                                retryable=True)
            return protocol._emit([error], now)  # stamped and journaled like any server event

        for item in protocol.start(time.monotonic()):
            await sink(item)
        if self.cleanup_failure is not None:
            for item in protocol.poisoned(self.cleanup_failure, time.monotonic()):
                await sink(item)
            first_outbox.close(att.close_code or 1011)
            await first_outbox.closed()
            return
        shell = SessionShell(protocol, cfg.model_factory(), sink, synthesizer=cfg.synthesizer,
                             max_inbox_messages=cfg.max_inbox_messages, max_inbox_bytes=cfg.max_inbox_bytes,
                             refuse=refuse)
        att.shell = shell
        self.sessions[core.session_id] = shell
        self.tiered[core.session_id] = att
        if first is not None:
            shell.submit(first)
        reader = asyncio.create_task(self._read(att, websocket))
        try:
            await shell.run()
        finally:
            att.ended.set()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            self.sessions.pop(core.session_id, None)
            self.tiered.pop(core.session_id, None)
            if shell.cleanup_error is not None:
                self.cleanup_failure = f"model abort failed: {shell.cleanup_error}"
                log.error("session %s: %s; refusing new sessions", core.session_id, self.cleanup_failure)
            outbox, att.socket, att.outbox = att.outbox, None, None
            if outbox is not None:
                outbox.close(att.close_code or 1000)
                await outbox.closed()
            if att._closers:
                await asyncio.gather(*att._closers, return_exceptions=True)
            self.backpressure.append(_backpressure_stats("tiered", core.session_id, shell, att.peak_outbound_bytes,
                                                         att.peak_outbound_events, att.detached_overflows))

    @staticmethod
    async def _read(att: _Attachment, websocket: WebSocket) -> None:
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                if att.socket is not websocket or att.shell is None:
                    break  # replaced by a resumed socket
                data = message.get("text") if message.get("text") is not None else message.get("bytes")
                if data is not None:
                    await att.shell.offer(data)
        except Exception:  # a transport error is a drop like any other
            log.debug("tiered socket reader failed", exc_info=True)
        outbox = att.outbox if att.socket is websocket else None
        att.detach(websocket)
        if outbox is not None:
            outbox.abort()  # the client is gone: nothing queued can reach it

    async def _resume(self, websocket: WebSocket, request: tiered_parser.SessionResume) -> None:
        att = self.tiered.get(request.session_id)
        if att is None or att.ended.is_set():
            await self._answer(websocket, _dumps(self._error("session_resume_expired", "no live session with that id",
                                                             event_id=request.event_id)), 1000)
            return
        async with att.lock:  # nothing below waits: the replay and live events cannot interleave
            outcome = att.protocol.resume(request, time.monotonic())
            if not outcome.ok:
                for item in outcome.outputs:
                    with contextlib.suppress(Exception):
                        await websocket.send_text(item.text)
                with contextlib.suppress(Exception):
                    await websocket.close(1000)
                return
            old = att.outbox
            if old is not None:
                if outcome.replaced is not None:
                    old.put(outcome.replaced.text, force=True)
                att.retire(old, 1000, "session_replaced")
            outbox = att.attach(websocket, resume_outputs=len(outcome.outputs))
            for item in outcome.outputs:
                outbox.put(item.text, force=True)  # the journal bounds the replay
            last = [o.seq for o in outcome.outputs if o.seq is not None]
            att.sent_through = max([att.sent_through, *last])
        try:
            await self._read(att, websocket)  # until this socket drops, is replaced, or the session ends
        finally:
            await outbox.closed()  # closed by whoever retired it: a takeover, the session's end, or a drop


def create_app(config: ServerConfig | None = None, *, on_ready: Callable[[], None] | None = None) -> Starlette:
    """The app; ``on_ready`` runs once the server has started (tests use it instead of polling)."""
    server = VoicechatServer(config or ServerConfig.simulator())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if server.config.warmup_positions > 0:  # before uvicorn accepts the first connection
            server.warmup = await asyncio.get_running_loop().run_in_executor(
                None, warm_up, server.config.model_factory(), server.config.warmup_positions
            )
            log.info("warmup: %d positions in %.3f s", server.warmup.positions, server.warmup.seconds)
        if on_ready is not None:
            on_ready()
        yield

    app = Starlette(
        lifespan=lifespan,
        routes=[
            Route("/health", server.health),
            WebSocketRoute("/v1/realtime", server.realtime),
            WebSocketRoute("/v1/duplex", server.realtime),
            WebSocketRoute("/v1/voicechat", server.v3),
        ]
    )
    app.state.voicechat = server
    return app


class VoicechatUvicornServer(uvicorn.Server):
    """uvicorn's server, ending our sessions first when it shuts down (``VoicechatServer.end_all_sessions``)."""

    def __init__(self, config: uvicorn.Config, voicechat: VoicechatServer) -> None:
        super().__init__(config)
        self.voicechat = voicechat

    async def shutdown(self, sockets: Any = None) -> None:
        self.voicechat.end_all_sessions()
        await super().shutdown(sockets=sockets)
