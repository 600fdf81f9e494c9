"""The ASGI app: ``/v1/voicechat`` speaks v3, ``/v1/duplex`` the tiered dialect, ``/v1/realtime`` either (chosen
per request, docs/tiered-dialect.md §1.1), ``/health`` reports readiness.

:class:`VoicechatServer` puts the server's parts together, each with one job: the handshake and admission
(``handshake.py``), hosting admitted sessions, both dialects through one path (``hosting.py``; one record per live
session, ``live.py``), readiness (``readiness.py``) and the operators' views (``views.py``). Protocol rules and
protocol JSON live in the core and the wire sessions, the outbound queue in ``outbox.py``, the socket a session is
attached to in ``attachment.py``; the server only moves frames and enforces admission.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route, WebSocketRoute

from ..fleet.agent import agent_reply, serve_agent
from ..ops import prometheus
from ..ops.usage import UsageBook
from .admission import Admission
from .auth import ApiKeys, RequireApiKey
from .config import ServerConfig
from .handshake import Handshake
from .heap import Heap
from .hosting import Host
from .live import LiveSessions
from .page import page_routes
from .readiness import Readiness
from .uvicorn import VoicechatUvicornServer
from .views import OperatorViews
from .warmup import warm_up

log = logging.getLogger("vllm_omni_voicechat.server")

__all__ = ["VoicechatServer", "VoicechatUvicornServer", "create_app"]


class VoicechatServer:
    """The server's parts, made once per app: what each session shares (config, slots, usage, heap, the live
    sessions) and the parts that serve them."""

    def __init__(self, config: ServerConfig, *, heap: Heap | None = None) -> None:
        self.config = config
        self.admission = Admission(config.max_sessions, queue_capacity=config.admission_queue)
        started_at = time.monotonic()
        self.usage = UsageBook(started_at)  # what every session did: /v1/usage, /v1/sessions, Prometheus
        self.heap = heap or Heap(managed=False)  # create_app's manage_heap: start-up frozen, full collections a backstop
        self.live = LiveSessions()
        self.readiness = Readiness(self.live)
        self.host = Host(config, self.usage, self.readiness, self.live, lambda: self.heap)
        self.handshake = Handshake(config, self.admission, self.usage, self.host, self.typed_ready)
        self.views = OperatorViews(config, self.admission, self.usage, self.live, self.readiness, self.typed_ready,
                                   started_at)
        prometheus.install(self.views)  # this process's /metrics (ours standalone, vLLM's inside vllm-omni serve)

    def agent_reply(self) -> str:
        """The line HAProxy's agent check reads (``fleet/agent.py``)."""
        return agent_reply(self.admission.free, self.admission.draining)

    def drain(self) -> None:
        """Take no new session; the ones held go on (and resume) until they end."""
        if not self.admission.draining:
            log.info("draining: no new sessions; %d held", self.admission.active)
        self.admission.drain()

    def typed_ready(self) -> bool:
        synth = self.config.synthesizer
        return bool(synth is not None and synth.ready)


def create_app(config: ServerConfig | None = None, *, on_ready: Callable[[], None] | None = None,
               manage_heap: bool = False, heap: Heap | None = None) -> Starlette:
    """The app; ``on_ready`` runs once the server has started (tests use it instead of polling). ``manage_heap``:
    the process serves only this app (the CLI, the soak): see server/heap.py; ``heap``: another policy for it (a
    benchmark's baseline)."""
    server = VoicechatServer(config or ServerConfig.simulator(), heap=heap or Heap(managed=manage_heap))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if server.config.warmup_positions > 0:  # before uvicorn accepts the first connection
            server.readiness.record_warmup(await asyncio.get_running_loop().run_in_executor(
                None, warm_up, server.config.model_factory(), server.config.warmup_positions
            ))
        loop = asyncio.get_running_loop()
        server.heap.started(time.monotonic())
        backstop: asyncio.TimerHandle | None = None

        def check_heap() -> None:
            nonlocal backstop
            delay = server.heap.backstop(time.monotonic())
            backstop = loop.call_later(delay, check_heap) if delay is not None else None

        trimmer: asyncio.TimerHandle | None = None

        def trim_heap() -> None:
            nonlocal trimmer
            delay = server.heap.trim_due()
            trimmer = loop.call_later(delay, trim_heap) if delay is not None else None

        check_heap()
        trim_heap()
        agent = None
        if server.config.agent_port is not None:
            agent = await serve_agent(server.config.agent_host, server.config.agent_port, server.agent_reply)
        if on_ready is not None:
            on_ready()
        yield
        if agent is not None:
            agent.close()
        for timer in (backstop, trimmer):
            if timer is not None:
                timer.cancel()
        server.host.model_pool.shutdown(wait=False, cancel_futures=True)

    keys = server.config.api_keys
    app = Starlette(
        lifespan=lifespan,
        middleware=[Middleware(RequireApiKey, keys=ApiKeys(keys))] if keys else [],
        routes=[
            Route("/health", server.views.health),
            Route("/v1/sessions", server.views.sessions_endpoint),
            Route("/v1/usage", server.views.usage_endpoint),
            Route("/metrics", server.views.metrics_endpoint),
            WebSocketRoute("/v1/realtime", server.handshake.realtime),
            WebSocketRoute("/v1/duplex", server.handshake.realtime),
            WebSocketRoute("/v1/voicechat", server.handshake.v3),
            *page_routes(),
        ]
    )
    app.state.voicechat = server
    return app
