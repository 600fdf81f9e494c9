"""Our routes inside ``vllm-omni serve`` (docs/omni-integration.md §1.6, D1, D7).

Private seam: ``vllm_omni.entrypoints.openai.api_server.router`` (the module-level ``APIRouter``) is included into
the app by ``omni_run_server_worker`` AFTER ``build_async_omni`` has loaded our duplex plugin. Routes inserted at its
front win over vLLM-Omni's ``/v1/realtime``, ``/v1/duplex`` and ``/health`` (first match wins), and its
``lifespan_context`` is merged into the app's, so our start (server + warmup) runs before the first accept.
``/v1/models`` and everything else stay vLLM-Omni's / vLLM's. ``tests/test_omni_mount.py`` pins the seam.

Keepalive: vLLM's ``serve_http`` builds uvicorn's ``Config`` with its WebSocket pings on (20 s / 20 s) and no option
to turn them off, but the v3 contract wants no protocol pings (a long model step or a lagging consumer must never
trip a transport timer). ``serve_http`` publishes its ``uvicorn.Server`` as ``app.state.server``; uvicorn reads
``config.ws_ping_*`` when it makes each connection, so the mount sets both to None before the first accept (for
every WebSocket route of the process, as our standalone server does).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import logging
import os
import sys
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from ..fleet.agent import serve_agent
from ..server.app import VoicechatServer
from ..server.auth import SubprotocolCredential, safe_subprotocol
from ..server.config import ServerConfig
from ..server.page import page_routes
from ..server.warmup import warm_up
from .batching import EngineBatcher
from .port import OmniStage0Port
from .register import log_through_vllm
from .settings import environment_settings, read_settings

log = logging.getLogger(__name__)
API_SERVER_MODULE = "vllm_omni.entrypoints.openai.api_server"
_MARKER = "_vllm_omni_voicechat_mounted"


class VoicechatMount:
    """Our server on vLLM-Omni's engine: built at app startup from ``app.state.engine_client``."""

    def __init__(self, plugin: Any, **settings: Any) -> None:
        self.plugin = plugin
        self.settings = settings
        self.server: VoicechatServer | None = None
        self.batcher: EngineBatcher | None = None
        self.pings_off = False
        self.agent: asyncio.Server | None = None

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.close()
            self.agent = None

    async def start(self, app: Any) -> None:
        self.pings_off = pings_off(app)
        if os.environ.get("VLLM_OMNI_EVENT_DRIVEN_ORCH") != "1":
            log.warning("vLLM-Omni's orchestrator polls its stages every 1 ms: start with VLLM_OMNI_EVENT_DRIVEN_ORCH=1 "
                        "(vllm-omni-voicechat serve sets it; docs/running-on-gpu.md)")
        external_auth = subprotocol_keys_reach_vllm(app)
        engine_client = app.state.engine_client
        # The deploy YAML's voicechat: block, under what the mount was given explicitly.
        self.settings = {**read_settings(getattr(engine_client, "config_path", None)),
                         **environment_settings(os.environ), **self.settings}
        apply = getattr(self.plugin, "apply_settings", None)
        if apply is not None:
            apply(self.settings)  # the plugin's own position backstop and fence: the same values as our runtime
        loop = asyncio.get_running_loop()
        bus = self.plugin.bus
        step_timeout_s = float(self.settings.pop("step_timeout_s", 10.0))
        audio_lag = int(self.settings.pop("audio_lag_positions", 0))
        warmup_positions = int(self.settings.pop("warmup_positions", 0))
        tick_slot_s = float(self.settings.pop("tick_slot_ms", 0.0)) / 1000.0
        # One tick for the engine: every session's positions go to it together (runner/tick.py); 0: no batching.
        self.batcher = EngineBatcher(tick_slot_s, loop) if tick_slot_s > 0 else None
        if self.batcher is not None:
            log.info("engine tick: positions of concurrent sessions batched within a %.0f ms slot", tick_slot_s * 1e3)

        def factory() -> OmniStage0Port:
            return OmniStage0Port(engine_client, loop, bus, step_timeout_s=step_timeout_s, audio_lag=audio_lag,
                                  batcher=self.batcher)

        max_sessions = getattr(getattr(engine_client, "duplex_session_config", None), "max_sessions", None) or 1
        synthesizer = await loop.run_in_executor(None, _typed_input_synthesizer)
        config = ServerConfig(model_kind="vllm-omni", model_factory=factory, max_sessions=max_sessions,
                              synthesizer=synthesizer, warmup_positions=warmup_positions,
                              external_auth=external_auth, **self.settings)
        self.server = VoicechatServer(config)
        self.server.readiness.engine_probe = lambda: engine_failure(engine_client)
        if config.agent_port is not None:  # a replica behind HAProxy (deploy/haproxy/README.md)
            self.agent = await serve_agent(config.agent_host, config.agent_port, self.server.agent_reply)
        self.api_server_count = int(getattr(app.state, "api_server_count", 1) or 1)
        if warmup_positions > 0:
            self.server.readiness.record_warmup(await loop.run_in_executor(None, warm_up, factory(), warmup_positions))

    async def health(self, request: Request) -> JSONResponse:
        if self.server is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        return await self.server.views.health(request)

    async def _refuse(self, websocket: WebSocket, code: str, message: str, close: int) -> None:
        await websocket.accept(subprotocol=safe_subprotocol(websocket.scope.get("subprotocols") or ()))
        with contextlib.suppress(Exception):
            await websocket.send_json({"type": "error", "error": {"type": "invalid_request_error", "code": code,
                                                                  "message": message}})
            await websocket.close(close)

    async def realtime(self, websocket: WebSocket) -> None:
        if await self._usable(websocket):
            await self.server.handshake.realtime(websocket)  # type: ignore[union-attr]

    async def v3(self, websocket: WebSocket) -> None:
        if await self._usable(websocket):
            await self.server.handshake.v3(websocket)  # type: ignore[union-attr]

    async def _usable(self, websocket: WebSocket) -> bool:
        if self.server is None:
            await self._refuse(websocket, "server_starting", "the server is still starting", 1013)
            return False
        if self.api_server_count != 1:  # sessions live in one API process (vLLM-Omni refuses the same way)
            await self._refuse(websocket, "multi_api_duplex_unsupported", "run one API server for duplex", 1008)
            return False
        return True

    async def sessions(self, request: Request) -> JSONResponse:
        if self.server is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        return await self.server.views.sessions_endpoint(request)

    async def usage(self, request: Request) -> JSONResponse:
        if self.server is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        return await self.server.views.usage_endpoint(request)

    def routes(self) -> list:
        """Ours, ahead of vLLM-Omni's. ``/metrics`` stays vLLM's: our collector is in the registry it serves."""
        return [Route("/health", self.health), Route("/v1/sessions", self.sessions), Route("/v1/usage", self.usage),
                WebSocketRoute("/v1/realtime", self.realtime), WebSocketRoute("/v1/duplex", self.realtime),
                WebSocketRoute("/v1/voicechat", self.v3), *page_routes()]


async def engine_failure(engine_client: Any) -> str | None:
    """Why vLLM-Omni's engine cannot serve a session, or None: its own ``check_health`` (the orchestrator is alive
    and every stage has a live replica; a killed stage process fails it). ``/health`` reports ``failed`` with it."""
    check = getattr(engine_client, "check_health", None)
    if check is None:
        return None
    try:
        result = check()
        if inspect.isawaitable(result):
            await result
    except Exception as exc:  # EngineDeadError's args: its generic message, then the specific one
        return f"vLLM-Omni's engine is not healthy: {exc.args[-1] if exc.args else type(exc).__name__}"
    return None


def subprotocol_keys_reach_vllm(app: Any) -> bool:
    """With vLLM's ``--api-key`` on (its ``AuthenticationMiddleware`` in the app's middleware), let a browser's
    subprotocol key reach it as the header it checks: our shim goes around the middleware stack the app built at
    its first call (the lifespan we run in). Returns whether vLLM checks keys."""
    middleware = getattr(app, "user_middleware", ())
    checks = any(getattr(m.cls, "__name__", "") == "AuthenticationMiddleware" for m in middleware)
    stack = getattr(app, "middleware_stack", None)
    if checks and stack is not None and not isinstance(stack, SubprotocolCredential):
        app.middleware_stack = SubprotocolCredential(stack)
        log.info("API keys (vLLM's --api-key) also accepted as a WebSocket subprotocol (browsers)")
    return checks


def pings_off(app: Any) -> bool:
    """Turn uvicorn's WebSocket keepalive off for the connections ``serve_http``'s server makes from now on; False
    (and a warning) when the app has no such server."""
    config = getattr(getattr(getattr(app, "state", None), "server", None), "config", None)
    if config is None or not hasattr(config, "ws_ping_interval"):
        log.warning("WebSocket keepalive pings left as the server set them: app.state.server has no uvicorn config")
        return False
    config.ws_ping_interval = None
    config.ws_ping_timeout = None
    log.info("WebSocket keepalive pings off (the v3 contract: no protocol pings; liveness is voicechat.metrics)")
    return True


def _typed_input_synthesizer() -> Any:
    """Pocket TTS for typed input when it is installed and loads; otherwise None (typed input unavailable)."""
    if importlib.util.find_spec("pocket_tts") is None:
        return None
    from ..synth.pocket import PocketSynthesizer
    from ..synth.port import SynthesizerUnavailable

    synthesizer = PocketSynthesizer()
    try:
        synthesizer.load()
    except SynthesizerUnavailable as exc:
        log.warning("typed input unavailable: %s", exc)
        return None
    return synthesizer


def install_for_serve(plugin: Any) -> bool:
    """Called by our plugin when vLLM-Omni loads it: mount our routes when this process is ``vllm-omni serve``
    (the API server module is imported and the command is ``serve``); a no-op anywhere else."""
    if sys.argv[1:2] != ["serve"] or API_SERVER_MODULE not in sys.modules:
        return False
    log_through_vllm()
    return install(VoicechatMount(plugin))


def install(mount: VoicechatMount, router: Any = None) -> bool:
    """Put ``mount``'s routes at the front of vLLM-Omni's API router and its start into the router's lifespan.

    Without ``router``, only inside ``vllm-omni serve`` (the api_server module is imported); idempotent.
    """
    if router is None:
        api = sys.modules.get(API_SERVER_MODULE)
        if api is None:
            return False  # plain DuplexOmni use or a test: nothing to mount into
        router = api.router
    if getattr(router, _MARKER, False):
        return False
    router.routes[0:0] = mount.routes()
    inner = router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app: Any):
        async with inner(app) as state:
            await mount.start(app)
            try:
                yield state
            finally:
                mount.stop()

    router.lifespan_context = lifespan
    setattr(router, _MARKER, True)
    log.info("voicechat routes mounted: /health /v1/sessions /v1/usage /v1/realtime /v1/duplex /v1/voicechat / /ui/")
    return True
