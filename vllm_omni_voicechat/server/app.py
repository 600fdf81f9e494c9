"""The ASGI app: ``/v1/voicechat`` speaks v3, ``/v1/duplex`` the tiered dialect, ``/v1/realtime`` either (chosen
per request, docs/tiered-dialect.md §1.1), ``/health`` reports readiness.

Each admitted connection gets its own session core, model instance and asyncio shell with a one-thread model
executor, so a slow or failing session never blocks another. Protocol rules live in the core and the wire
session; this module only moves frames and enforces admission.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from ..session.core import SessionConfig, SessionCore
from ..shell.aio import SessionShell
from ..wire.tiered import parser as tiered_parser
from ..wire.tiered.connection import Detached, Outbound, TieredOptions, TieredSession
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


def _dumps(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)


class _Attachment:
    """A tiered session and the socket it is attached to (None while detached); sends are serialized so a
    resume's replay and live events never interleave."""

    def __init__(self, protocol: TieredSession) -> None:
        self.protocol = protocol
        self.shell: SessionShell | None = None
        self.socket: WebSocket | None = None
        self.lock = asyncio.Lock()
        self.sent_through = 0
        self.close_code: int | None = None
        self.ended = asyncio.Event()

    async def send(self, item: Outbound) -> None:
        async with self.lock:
            ws = self.socket
            if ws is None or (item.seq is not None and item.seq <= self.sent_through):
                return  # detached (the journal keeps it) or already replayed on this socket
            try:
                await ws.send_text(item.text)
            except Exception:
                self.detach(ws)
                return
            if item.seq is not None:
                self.sent_through = item.seq

    def detach(self, ws: WebSocket) -> None:
        if self.socket is not ws:
            return  # a superseded socket going away changes nothing
        self.socket = None
        if self.protocol.resumable:
            # Set at once, on the loop: a resume arriving before the shell's next turn sees the session detached.
            self.protocol.detach(time.monotonic())
            if self.shell is not None:
                self.shell.submit(Detached(self.protocol.credential.generation))  # type: ignore[arg-type]
        elif self.shell is not None:
            self.shell.disconnect()


class VoicechatServer:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.admission = Admission(config.max_sessions)
        self.started_at = time.monotonic()
        self.sessions: dict[str, SessionShell] = {}
        self.cleanup_failure: str | None = None  # set when a session's model abort failed: new sessions refused
        self.tiered: dict[str, _Attachment] = {}  # live and detached tiered sessions, for session.resume
        self.warmup: WarmupReport | None = None

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

        async def sink(item: Any) -> None:
            nonlocal close_code, gone
            if isinstance(item, CloseTransport):
                close_code = item.code
                return
            if gone:
                return
            try:
                await websocket.send_text(_dumps(item))
            except Exception:
                gone = True
                if shell is not None:
                    shell.disconnect()

        for item in protocol.start(time.monotonic()):
            await sink(item)
        if self.cleanup_failure is not None:
            # A poisoned model home: greet, then fail the session before it can touch the model.
            for item in protocol.poisoned(self.cleanup_failure, time.monotonic()):
                await sink(item)
            await websocket.close(close_code or 1011)
            return
        shell = SessionShell(protocol, cfg.model_factory(), sink, synthesizer=cfg.synthesizer)
        self.sessions[core.session_id] = shell

        async def read() -> None:
            nonlocal gone
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    gone = True
                    shell.disconnect()
                    return
                if message.get("text") is not None:
                    shell.submit(message["text"])
                elif message.get("bytes") is not None:
                    shell.submit(message["bytes"])

        reader = asyncio.create_task(read())
        try:
            await shell.run()
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            self.sessions.pop(core.session_id, None)
            if shell.cleanup_error is not None:
                self.cleanup_failure = f"model abort failed: {shell.cleanup_error}"
                log.error("session %s: %s; refusing new sessions", core.session_id, self.cleanup_failure)
        if not gone:
            try:
                await websocket.close(close_code or 1000)
            except Exception:
                pass


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
        att = _Attachment(protocol)
        att.socket = websocket

        async def sink(item: Any) -> None:
            if isinstance(item, CloseTransport):
                att.close_code = item.code
            elif isinstance(item, Outbound):
                await att.send(item)

        for item in protocol.start(time.monotonic()):
            await sink(item)
        if self.cleanup_failure is not None:
            for item in protocol.poisoned(self.cleanup_failure, time.monotonic()):
                await sink(item)
            await websocket.close(att.close_code or 1011)
            return
        shell = SessionShell(protocol, cfg.model_factory(), sink, synthesizer=cfg.synthesizer)
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
            ws, att.socket = att.socket, None
            if ws is not None:
                with contextlib.suppress(Exception):
                    await ws.close(att.close_code or 1000)

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
                    att.shell.submit(data)
        except Exception:  # a transport error is a drop like any other
            pass
        att.detach(websocket)

    async def _resume(self, websocket: WebSocket, request: tiered_parser.SessionResume) -> None:
        att = self.tiered.get(request.session_id)
        if att is None or att.ended.is_set():
            await self._answer(websocket, _dumps(self._error("session_resume_expired", "no live session with that id",
                                                             event_id=request.event_id)), 1000)
            return
        async with att.lock:
            outcome = att.protocol.resume(request, time.monotonic())
            if not outcome.ok:
                for item in outcome.outputs:
                    with contextlib.suppress(Exception):
                        await websocket.send_text(item.text)
                with contextlib.suppress(Exception):
                    await websocket.close(1000)
                return
            old, att.socket = att.socket, websocket
            if old is not None:
                with contextlib.suppress(Exception):
                    if outcome.replaced is not None:
                        await old.send_text(outcome.replaced.text)
                    await old.close(1000, "session_replaced")
            try:
                for item in outcome.outputs:
                    await websocket.send_text(item.text)
            except Exception:
                att.protocol.rollback_resume()
                att.socket = None
                att.protocol.detach(time.monotonic())
                if att.shell is not None:
                    att.shell.submit(Detached(att.protocol.credential.generation))  # type: ignore[arg-type]
                return
            last = [o.seq for o in outcome.outputs if o.seq is not None]
            att.sent_through = max([att.sent_through, *last])
        await self._read(att, websocket)  # until this socket drops, is replaced, or the session ends


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
