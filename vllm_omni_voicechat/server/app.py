"""The ASGI app: ``/v1/voicechat`` speaks v3, ``/v1/duplex`` the tiered dialect, ``/v1/realtime`` either (chosen
per request, docs/tiered-dialect.md §1.1), ``/health`` reports readiness.

Each admitted connection gets its own session core, model instance and asyncio shell. A model with microsecond
steps (the simulator) steps on the loop, its prefill and abort in a small pool all such sessions share (no thread
per session); any other model gets a one-thread executor of its own for prefill, abort and steps, so a slow or
failing session never blocks another. Both dialects run through one host path
(:meth:`VoicechatServer.serve`); protocol rules and protocol JSON live in the core and the wire sessions, the
outbound queue in ``outbox.py``, the socket a session is attached to in ``attachment.py``; this module only moves
frames and enforces admission.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from ..model.port import ModelTimeout
from ..ops import prometheus
from ..ops.usage import UsageBook
from ..session.core import SessionCore
from ..session.functions import CALL_ID_HEX
from ..shell.aio import SessionShell
from ..trace.tap import tap_socket
from ..wire.limits import FIRST_MESSAGE_MAX_BYTES
from ..wire.tiered import parser as tiered_parser
from ..wire.tiered.connection import TieredOptions, TieredSession
from ..wire.tiered.routing import UnknownRoute, duplex_off_answer_text, select_route
from ..wire.tiered.schema import CLOSE_TRY_AGAIN_LATER
from ..wire.tiered.session_events import handshake_error, queue_event
from ..wire.transport import close_reason
from ..wire.v3 import PROTOCOL, V3Options, V3Session, busy_error
from ..wire.v3.schema import CLOSE_BUSY
from .admission import Admission, Slot
from .auth import ApiKeys, RequireApiKey, safe_subprotocol
from .attachment import Attachment
from .config import ServerConfig
from .heap import Heap
from .outbox import Outbox
from .page import page_routes
from .reader import read_socket
from .uvicorn import VoicechatUvicornServer, limit_messages
from .warmup import WarmupReport, warm_up

log = logging.getLogger("vllm_omni_voicechat.server")
MODEL_POOL_THREADS = 4

__all__ = ["VoicechatServer", "VoicechatUvicornServer", "create_app"]


def error_logger(session_id: str) -> Callable[[str], None]:
    """A warning for every error event a session sends (its code; never content)."""

    def warn(code: str) -> None:
        log.warning("session %s sent error %s", session_id, code)

    return warn


class VoicechatServer:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.admission = Admission(config.max_sessions, queue_capacity=config.admission_queue)
        self.started_at = time.monotonic()
        self.sessions: dict[str, SessionShell] = {}
        self.cleanup_failure: str | None = None  # set when a session's model abort failed: new sessions refused
        # A session's model step timed out (a stalled engine?): (when, what), degraded until a later position completes
        self.model_stall: tuple[float, str] | None = None
        # The host's engine check (inside vllm-omni serve: vLLM-Omni's check_health): why the engine is broken, or None
        self.engine_probe: Callable[[], Awaitable[str | None]] | None = None
        self.attachments: dict[str, Attachment] = {}  # every live session's socket
        self.tiered: dict[str, Attachment] = {}  # live and detached tiered sessions (either lane), for session.resume
        self.warmup: WarmupReport | None = None
        self.backpressure: deque[dict[str, Any]] = deque(maxlen=256)  # the last ended sessions (benchmarks, tests)
        self.usage = UsageBook(self.started_at)  # what every session did: /v1/usage, /v1/sessions, Prometheus
        self.heap = Heap(managed=False)  # create_app's manage_heap: start-up frozen, full collections a backstop
        self.draining: dict[str, tuple[str, float]] = {}  # ended, slot freed, socket still closing: (dialect, since)
        # Prefill and abort of the inline-step models (threads start on first use; each session's calls in order)
        self.model_pool = concurrent.futures.ThreadPoolExecutor(MODEL_POOL_THREADS,
                                                                thread_name_prefix="voicechat-model")
        prometheus.install(self)  # this process's /metrics (ours standalone, vLLM's inside vllm-omni serve)

    def _handler_done(self, slot: Slot, session_id: str) -> None:
        """A session's handler has returned: its slot is free and its tally ended (a backstop: it ends once). The
        session frees itself; only the heap's former policy collects after it (server/heap.py)."""
        slot.release()
        self.usage.end(session_id, "disconnect", time.monotonic())
        delay = self.heap.session_ended(time.monotonic())
        if delay is not None:
            asyncio.get_running_loop().call_later(delay, lambda: self.heap.collect_due(time.monotonic()))

    def outbox(self, session_id: str) -> Outbox | None:
        """The outbound queue of a live session's current socket (benchmarks, tests)."""
        att = self.attachments.get(session_id)
        return att.outbox if att is not None else None

    def end_all_sessions(self) -> None:
        """Server shutdown: end every session now, on the server's loop. A detached tiered session would otherwise
        wait out its disconnect grace in its ASGI task, and uvicorn's graceful shutdown waits for that task."""
        for shell in list(self.sessions.values()):
            shell.disconnect()

    @property
    def warmup_failed(self) -> bool:
        return self.warmup is not None and self.warmup.error is not None

    def record_warmup(self, report: WarmupReport) -> None:
        self.warmup = report
        if report.error is None:
            log.info("warmup: %d positions in %.3f s (step ms %s)", report.positions, report.seconds,
                     list(report.step_ms))
        else:
            log.error("warmup failed after %d positions: %s; serving degraded", report.positions, report.error)

    @property
    def typed_ready(self) -> bool:
        synth = self.config.synthesizer
        return bool(synth is not None and synth.ready)

    def _stall(self) -> str | None:
        """The last model stall, unless a position has completed since (the engine answers again)."""
        stall = self.model_stall
        if stall is not None and any((s.last_step_at or 0.0) > stall[0] for s in list(self.sessions.values())):
            self.model_stall = stall = None
        return None if stall is None else stall[1]

    def readiness(self, engine_failure: str | None = None) -> tuple[str, str | None]:
        """``/health``'s status and why it is not ``ready``: ``failed`` when the engine is broken (``engine_failure``,
        from the host's probe), ``degraded`` after a failed model cleanup, a failed warm-up or a model stall."""
        if engine_failure is not None:
            return "failed", engine_failure
        if self.cleanup_failure:
            return "degraded", self.cleanup_failure
        if self.warmup_failed:
            return "degraded", f"warmup failed: {self.warmup.error}"  # type: ignore[union-attr]
        stall = self._stall()
        if stall is not None:
            return "degraded", f"a model step timed out ({stall}); no position has completed since"
        return "ready", None

    async def health(self, request: Request) -> JSONResponse:
        engine_failure = await self.engine_probe() if self.engine_probe is not None else None
        status, reason = self.readiness(engine_failure)
        return JSONResponse(
            {
                "status": status,
                **({"reason": reason} if reason is not None else {}),
                **({"engine": "dead" if engine_failure else "healthy"} if self.engine_probe is not None else {}),
                "model": "cleanup_failed" if self.cleanup_failure else "ready",
                **({"model_cleanup_failure": self.cleanup_failure} if self.cleanup_failure else {}),
                "model_kind": self.config.model_kind,
                "protocol": dict(PROTOCOL),
                "auth_required": bool(self.config.api_keys) or self.config.external_auth,
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
                "warmup": None if self.warmup is None else self.warmup.to_json(),
            },
            status_code=503 if status == "failed" else 200,
        )

    # ================================================================ operators' views (off the WebSocket path)

    def sessions_status(self, now: float) -> dict[str, Any]:
        """Every slot: idle, or a session that is active / detached (grace left); plus the sessions draining
        (ended, their socket still closing). Counts and states only: no audio, text or credentials."""
        rows: list[dict[str, Any]] = []
        for session_id, shell in list(self.sessions.items()):
            att = self.attachments.get(session_id)
            tally = self.usage.live.get(session_id)
            row: dict[str, Any] = {"session_id": session_id, "dialect": tally.dialect if tally else None,
                                   "age_s": round(now - tally.started_at, 3) if tally else None,
                                   "positions": shell.positions, "state": "active"}
            detached_at = getattr(att.protocol, "detached_at", None) if att is not None else None
            if detached_at is not None:
                row["state"] = "detached"
                row["grace_left_s"] = round(max(0.0, self.config.disconnect_grace_s - (now - detached_at)), 3)
            rows.append(row)
        idle = max(0, self.admission.capacity - self.admission.active)
        return {
            "max_sessions": self.admission.capacity,
            "active": sum(1 for r in rows if r["state"] == "active"),
            "detached": sum(1 for r in rows if r["state"] == "detached"),
            "idle": idle,
            "slots": rows + [{"state": "idle"} for _ in range(idle)],
            "draining": [{"session_id": sid, "dialect": d, "draining_s": round(now - since, 3)}
                         for sid, (d, since) in list(self.draining.items())],
            "queued": len(self.admission.waiting),
            "queue_capacity": self.admission.queue_capacity,
        }

    def operator_gauges(self) -> dict[str, float]:
        detached = journal_bytes = 0
        for att in list(self.tiered.values()):
            protocol = att.protocol
            if protocol.detached_at is not None:
                detached += 1
            if protocol.journal is not None:
                journal_bytes += protocol.journal.retained_bytes
        return {"active": self.admission.active - detached, "detached": detached,
                "queued": len(self.admission.waiting),
                "journal_bytes": journal_bytes}

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(prometheus.exposition(), media_type=prometheus.CONTENT_TYPE)

    async def sessions_endpoint(self, request: Request) -> JSONResponse:
        return JSONResponse(self.sessions_status(time.monotonic()))

    async def usage_endpoint(self, request: Request) -> JSONResponse:
        return JSONResponse(self.usage.to_json(time.monotonic()))

    # ================================================================ the v3 dialect

    async def v3(self, websocket: WebSocket) -> None:
        tap_socket(websocket, self.config.trace_factory, "v3")  # tests: every frame through the trace checker
        await websocket.accept(subprotocol=safe_subprotocol(websocket.scope.get("subprotocols") or ()))
        limit_messages(websocket, self.config.v3_max_message_bytes)
        slot = self.admission.try_acquire()
        if slot is None:
            self.usage.reject("v3", "busy")
            await self._answer(websocket, busy_error(self.config.ids.uuid()).text, CLOSE_BUSY, "server_busy")
            return
        cfg = self.config
        core = SessionCore(cfg.session_config(cfg.ids.uuid(), typed_input_ready=self.typed_ready,
                                              turn_policy="model" if cfg.v3_turns == "legacy" else "client"))
        protocol = V3Session(core, V3Options(default_instructions=cfg.default_instructions,
                                             single_client=cfg.max_sessions == 1,
                                             legacy_turns=cfg.v3_turns == "legacy",
                                             max_inbox_messages=cfg.max_inbox_messages,
                                             configure_timeout_s=cfg.v3_configure_timeout_s,
                                             idle_timeout_s=cfg.v3_idle_timeout_s),
                             tally=self.usage.admit(core.session_id, "v3", time.monotonic(),
                                                    on_error=error_logger(core.session_id)))
        try:
            await self.serve(websocket, protocol, "v3", slot=slot)
        finally:
            self._handler_done(slot, protocol.session_id)

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
        await websocket.accept(subprotocol=safe_subprotocol(websocket.scope.get("subprotocols") or ()))
        # A first message (session.update or session.resume) is small: a client waiting for one holds no more.
        limit_messages(websocket, self.config.tiered_max_message_bytes if route.autostart else FIRST_MESSAGE_MAX_BYTES)
        if route.dialect == "duplex_off":
            await self._answer(websocket, duplex_off_answer_text(), 1000, "unsupported")
            return
        first: str | bytes | None = None
        if not route.autostart:
            try:
                message = await asyncio.wait_for(websocket.receive(), self.config.handshake_timeout_s)
            except TimeoutError:
                await self._answer(websocket, self._error("config_timeout", "no first message in time"), 1000,
                                   "config_timeout")
                return
            if message["type"] == "websocket.disconnect":
                return
            first = message.get("text") if message.get("text") is not None else message.get("bytes")
            limit_messages(websocket, self.config.tiered_max_message_bytes)
            parsed = tiered_parser.parse(first or "")
            if isinstance(parsed, tiered_parser.SessionResume) and route.lane != "full":
                err = self._error("unsupported_session_resume", "session.resume is served on the full lane only "
                                  "(/v1/realtime?duplex=1 or /v1/duplex)", event_id=parsed.event_id)
                await self._answer(websocket, err, 1000, "unsupported_session_resume")
                return
            if isinstance(parsed, tiered_parser.SessionResume):
                await self._resume(websocket, parsed)
                return
            if isinstance(parsed, tiered_parser.ParseError) and parsed.code == "invalid_session_resume":
                err = self._error(parsed.code, parsed.message, event_id=parsed.event_id, param=parsed.param)
                await self._answer(websocket, err, 1000, parsed.code)
                return
        slot = self.admission.try_acquire()
        held: list[str | bytes] = []  # what a queued client sent while it waited, handed over in order
        if slot is None and self.admission.queue_capacity:
            slot, reason = await self._queue_for_slot(websocket, held)
            if slot is None and reason is None:
                return  # the client left while queued
        else:
            reason = "resource_exhausted"
        if slot is None:
            self.usage.reject("tiered", reason or "resource_exhausted")
            limit = self.admission.capacity
            message = f"duplex_session_capacity_exhausted: limit={limit}"
            if reason == "queue_full":
                message += f"; admission queue full ({self.admission.queue_capacity})"
            elif reason == "queue_timeout":
                message += f"; no slot within {self.config.admission_timeout_s:g} s in the admission queue"
            err = self._error("resource_exhausted", message, retryable=True)
            await self._answer(websocket, err, CLOSE_TRY_AGAIN_LATER, "resource_exhausted")
            return
        cfg = self.config
        openai_lane = route.lane != "full"  # OpenAI caps ids at 32 characters (LiveKit rewrites longer call ids)
        core = SessionCore(cfg.session_config(
            f"sess_{cfg.ids.hex(13)}" if openai_lane else f"duplex-{cfg.ids.hex(16)}", typed_input_ready=self.typed_ready,
            call_id_hex=27 if openai_lane else CALL_ID_HEX, turn_policy="model", gate_open_after=1))
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
                admission_queue=cfg.admission_queue,
                ids=cfg.ids,
            ),
            tally=self.usage.admit(core.session_id, "tiered", time.monotonic(),
                                   on_error=error_logger(core.session_id)),
        )
        try:
            await self.serve(websocket, protocol, "tiered", first=first, slot=slot, held=held)
        finally:
            self._handler_done(slot, protocol.session_id)

    async def _queue_for_slot(self, websocket: WebSocket, held: list[str | bytes]) -> tuple[Slot | None, str | None]:
        """Wait in the admission queue: ``session.queued`` at once, ``session.queue_update`` when the position
        changes, ``session.queue_done`` when a slot is ours. Returns (slot, None), or (None, why: ``queue_full`` /
        ``queue_timeout``) for the busy answer, or (None, None) when the client left (it leaves the queue at once)."""
        changed = asyncio.Event()
        ticket = self.admission.enqueue(changed.set)
        if ticket is None:
            return None, "queue_full"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.admission_timeout_s
        reader: asyncio.Task | None = None
        if ticket.slot is not None:  # a slot was free after all: no queue events
            return ticket.slot, None
        try:
            if not await self._send_queue_event(websocket, "session.queued", ticket.position):
                return None, None
            told = ticket.position
            held_bytes = 0
            while ticket.slot is None:
                if (reader is None and len(held) < self.config.max_inbox_messages
                        and held_bytes < self.config.max_inbox_bytes):
                    # A disconnect must end the wait at once; with the pump full (the inbox's bounds: messages and
                    # bytes) nothing more is read (TCP backpressure)
                    reader = asyncio.ensure_future(websocket.receive())
                waiter = asyncio.ensure_future(changed.wait())
                done, _ = await asyncio.wait({w for w in (reader, waiter) if w is not None},
                                             timeout=max(0.0, deadline - loop.time()),
                                             return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                changed.clear()
                if reader in done:
                    message, reader = reader.result(), None
                    if message["type"] == "websocket.disconnect":
                        return None, None
                    data = message.get("text") if message.get("text") is not None else message.get("bytes")
                    if data is not None:
                        held.append(data)
                        held_bytes += len(data)
                if ticket.slot is None and not done:
                    return None, "queue_timeout"
                if ticket.slot is None and ticket.position != told:
                    told = ticket.position
                    if not await self._send_queue_event(websocket, "session.queue_update", told):
                        return None, None
            slot, ticket.slot = ticket.slot, None
            if not await self._send_queue_event(websocket, "session.queue_done", 0):
                slot.release()
                return None, None
            return slot, None
        finally:
            if reader is not None:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
            if ticket.slot is not None:  # admitted while leaving: give the slot on at once
                ticket.slot.release()
            self.admission.leave(ticket)

    async def _send_queue_event(self, websocket: WebSocket, type_: str, position: int) -> bool:
        mean = self.usage.mean_duration_s()
        wait = None if mean is None or position == 0 else position * mean / self.admission.capacity
        try:
            await websocket.send_text(queue_event(type_, server_event_id=f"event_{self.config.ids.hex(6)}",
                                                  position=position, estimated_wait_s=wait))
        except Exception:  # the client left
            return False
        return True

    def _error(self, code: str, message: str, **kw: Any) -> str:
        return handshake_error(code, message, server_event_id=f"event_{self.config.ids.hex(6)}", **kw)

    @staticmethod
    async def _answer(websocket: WebSocket, text: str, code: int, reason: str = "") -> None:
        try:
            await websocket.send_text(text)
            await websocket.close(code, reason)
        except Exception:  # the client left first
            pass

    # ================================================================ one host path for both dialects

    async def serve(self, websocket: WebSocket, protocol: Any, dialect: str, *,
                    first: str | bytes | None = None, slot: Slot | None = None,
                    held: list[str | bytes] | None = None) -> None:
        """Host an admitted session on ``websocket`` until it ends (stop, fatal error, disconnect or expiry).

        The session's ``slot`` is freed once the session has ended and its model is released, before its socket's
        close handshake: a client that has seen the close can open its next session at once."""
        cfg = self.config
        largest = cfg.v3_max_message_bytes if dialect == "v3" else cfg.tiered_max_message_bytes
        att = Attachment(protocol, cfg, fail_on_overflow=dialect == "v3", max_message_bytes=largest)
        first_outbox = att.attach(websocket)
        for item in protocol.start(time.monotonic()):
            att.sink(item)
        if self.cleanup_failure is not None:
            # A poisoned model home: greet, then fail the session before it can touch the model.
            for item in protocol.poisoned(self.cleanup_failure, time.monotonic()):
                att.sink(item)
            if slot is not None:
                slot.release()
            self.usage.end(protocol.session_id, ended_reason(att), time.monotonic())
            first_outbox.close(att.close_code or 1011, att.close_reason)
            await first_outbox.closed()
            return
        model = cfg.model_factory()
        shell = SessionShell(protocol, model, att.sink, synthesizer=cfg.synthesizer,
                             executor=self.model_pool if getattr(model, "inline_steps", False) else None,
                             max_inbox_messages=cfg.max_inbox_messages, max_inbox_bytes=cfg.max_inbox_bytes,
                             refusals=protocol)
        att.shell = shell
        session_id = protocol.session_id
        started = time.monotonic()
        lane = "v3" if dialect == "v3" else ("full" if getattr(protocol, "tier3", True) else "openai")
        client = websocket.scope.get("client") or ("?", 0)
        log.info("session %s started: %s, lane %s, client %s:%s, user agent %r", session_id, dialect, lane,
                 client[0], client[1], websocket.headers.get("user-agent", ""))
        self.sessions[session_id] = shell
        self.attachments[session_id] = att
        if dialect == "tiered":
            self.tiered[session_id] = att
        if first is not None:
            shell.submit(first)
        for message in held or ():
            shell.submit(message)
        reader = asyncio.create_task(read_socket(att, websocket))
        try:
            await shell.run()
        finally:
            att.ended.set()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            self.sessions.pop(session_id, None)
            self.attachments.pop(session_id, None)
            self.tiered.pop(session_id, None)
            if shell.cleanup_error is not None:
                self.cleanup_failure = f"model abort failed: {shell.cleanup_error}"
                log.error("session %s: %s; refusing new sessions", session_id, self.cleanup_failure)
            if isinstance(shell.model_error, ModelTimeout):
                self.model_stall = (time.monotonic(), shell.model_failure or str(shell.model_error))
                log.error("session %s: model step timed out (%s); serving degraded", session_id, shell.model_failure)
            elif self.model_stall is not None and (shell.last_step_at or 0.0) > self.model_stall[0]:
                self.model_stall = None
            if slot is not None:
                slot.release()
            tally = self.usage.live.get(session_id)
            summary = tally.summary() if tally is not None else {}
            reason = ended_reason(att)
            self.usage.end(session_id, reason, time.monotonic())
            duration_s = time.monotonic() - started
            self.draining[session_id] = (dialect, time.monotonic())
            try:
                await att.finish()
            finally:
                self.draining.pop(session_id, None)
            self.backpressure.append(att.stats(dialect))
            log.info("session %s ended: %s after %.1f s, %d positions, responses %s, function calls %s, errors %s, "
                     "reason %s (close %s %s)%s", session_id, dialect, duration_s, shell.positions,
                     summary.get("responses", {}), summary.get("function_calls", {}), summary.get("errors", {}),
                     tally.ended_reason if tally is not None and tally.ended_reason else reason,
                     att.close_code or 1000, att.close_label,
                     f"; model failure: {shell.model_failure}" if shell.model_failure else "")

    async def _resume(self, websocket: WebSocket, request: tiered_parser.SessionResume) -> None:
        att = self.tiered.get(request.session_id)
        if att is None or att.ended.is_set():
            self.usage.resume_refused()
            await self._answer(websocket, self._error("session_resume_expired", "no live session with that id",
                                                      event_id=request.event_id), 1000, "session_resume_expired")
            return
        early = att.protocol.refuse_early(request)  # a wrong token never pauses the session's input
        if early is not None:
            await self._refuse_resume(websocket, early)
            return
        async with att.resuming:
            received = time.monotonic()
            # What the old socket delivered is taken in first, so session.resumed's input receipt covers it (a
            # client resends exactly the rest); the old socket's reads stay fenced until the outcome.
            att.reads_open.clear()
            try:
                await att.settled()
                async with att.lock:  # nothing below waits: the replay and live events cannot interleave
                    outcome = att.protocol.resume(request, time.monotonic())
                    if outcome.ok:
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
                        self.usage.resumed(time.monotonic() - received)  # request -> replay queued
            finally:
                att.reads_open.set()
        if not outcome.ok:
            await self._refuse_resume(websocket, outcome)
            return
        try:
            await read_socket(att, websocket)  # until this socket drops, is replaced, or the session ends
        finally:
            await outbox.closed()  # closed by whoever retired it: a takeover, the session's end, or a drop

    async def _refuse_resume(self, websocket: WebSocket, outcome: Any) -> None:
        self.usage.resume_refused()
        for item in outcome.outputs:
            with contextlib.suppress(Exception):
                await websocket.send_text(item.text)
        with contextlib.suppress(Exception):
            await websocket.close(1000, _refusal_code(outcome.outputs))


def create_app(config: ServerConfig | None = None, *, on_ready: Callable[[], None] | None = None,
               manage_heap: bool = False, heap: Heap | None = None) -> Starlette:
    """The app; ``on_ready`` runs once the server has started (tests use it instead of polling). ``manage_heap``:
    the process serves only this app (the CLI, the soak): see server/heap.py; ``heap``: another policy for it (a
    benchmark's baseline)."""
    server = VoicechatServer(config or ServerConfig.simulator())
    server.heap = heap or Heap(managed=manage_heap)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if server.config.warmup_positions > 0:  # before uvicorn accepts the first connection
            server.record_warmup(await asyncio.get_running_loop().run_in_executor(
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
        if on_ready is not None:
            on_ready()
        yield
        for timer in (backstop, trimmer):
            if timer is not None:
                timer.cancel()
        server.model_pool.shutdown(wait=False, cancel_futures=True)

    keys = server.config.api_keys
    app = Starlette(
        lifespan=lifespan,
        middleware=[Middleware(RequireApiKey, keys=ApiKeys(keys))] if keys else [],
        routes=[
            Route("/health", server.health),
            Route("/v1/sessions", server.sessions_endpoint),
            Route("/v1/usage", server.usage_endpoint),
            Route("/metrics", server.metrics_endpoint),
            WebSocketRoute("/v1/realtime", server.realtime),
            WebSocketRoute("/v1/duplex", server.realtime),
            WebSocketRoute("/v1/voicechat", server.v3),
            *page_routes(),
        ]
    )
    app.state.voicechat = server
    return app


def ended_reason(att: Attachment) -> str:
    """How a session ended, from a bounded set: its close reason (an error code or a ``session.closed`` reason),
    else ``disconnect`` (the client left)."""
    if att.close_code is None:
        return att.close_label or "disconnect"  # a session failed by its own output backpressure says so
    return att.close_label or "completed"


def _refusal_code(outputs: list[Any]) -> str:
    """The close reason of a refused resume: the code of the error it was answered with."""
    for item in outputs:
        with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
            return close_reason(json.loads(item.text)["error"]["code"])
    return ""
