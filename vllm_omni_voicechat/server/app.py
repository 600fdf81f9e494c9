"""The ASGI app: ``/v1/realtime`` and ``/v1/voicechat`` speak v3, ``/health`` reports readiness.

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
from ..wire.transport import CloseTransport
from ..wire.v3 import PROTOCOL, V3Options, V3Session
from ..wire.v3.schema import CLOSE_BUSY
from .admission import Admission
from .config import ServerConfig

log = logging.getLogger("vllm_omni_voicechat.server")


def _dumps(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)


class VoicechatServer:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.admission = Admission(config.max_sessions)
        self.started_at = time.monotonic()
        self.sessions: dict[str, SessionShell] = {}
        self.cleanup_failure: str | None = None  # set when a session's model abort failed: new sessions refused

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


def create_app(config: ServerConfig | None = None, *, on_ready: Callable[[], None] | None = None) -> Starlette:
    """The app; ``on_ready`` runs once the server has started (tests use it instead of polling)."""
    server = VoicechatServer(config or ServerConfig.simulator())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if on_ready is not None:
            on_ready()
        yield

    app = Starlette(
        lifespan=lifespan,
        routes=[
            Route("/health", server.health),
            WebSocketRoute("/v1/realtime", server.v3),
            WebSocketRoute("/v1/voicechat", server.v3),
        ]
    )
    app.state.voicechat = server
    return app
