"""The handshake of both dialects: the route, the accept, the first message, admission (a free slot, the tiered
admission queue, or the dialect's busy answer), the session's core and protocol object; then the host takes it.
A ``session.resume`` is handed to the host with the session it names, or refused at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket

from ..fleet import keys
from ..ops.usage import UsageBook
from ..session.core import SessionCore
from ..session.functions import CALL_ID_HEX
from ..trace.tap import tap_socket
from ..wire.limits import FIRST_MESSAGE_MAX_BYTES, QUEUED_MAX_MESSAGE_BYTES
from ..wire.tiered import parser as tiered_parser
from ..wire.tiered.connection import TieredOptions, TieredSession
from ..wire.tiered.routing import UnknownRoute, duplex_off_answer_text, select_route
from ..wire.tiered.schema import CLOSE_TRY_AGAIN_LATER
from ..wire.tiered.session_events import handshake_error, queue_event
from ..wire.v3 import V3Options, V3Session, busy_error
from ..wire.v3.schema import CLOSE_BUSY, V3_TURN_POLICY
from .admission import Admission, Slot
from .auth import safe_subprotocol
from .config import ServerConfig
from .hosting import Host
from .uvicorn import limit_messages

log = logging.getLogger("vllm_omni_voicechat.server")


def error_logger(session_id: str) -> Callable[[str], None]:
    """A warning for every error event a session sends (its code; never content)."""

    def warn(code: str) -> None:
        log.warning("session %s sent error %s", session_id, code)

    return warn


class Handshake:
    def __init__(self, config: ServerConfig, admission: Admission, usage: UsageBook, host: Host,
                 typed_ready: Callable[[], bool]) -> None:
        self._config = config
        self._admission = admission
        self._usage = usage
        self._host = host
        self._typed_ready = typed_ready

    # ================================================================ the v3 dialect

    async def v3(self, websocket: WebSocket) -> None:
        early: Slot | None = None  # a slot taken before the accept: a balancer may try another replica without one
        if self._elsewhere(websocket):
            early = await self._slot_or_elsewhere(websocket, "v3")
            if early is None:
                return
        try:
            await self._v3(websocket, early)
        finally:
            if early is not None:
                early.release()  # idempotent: a hosted session's slot is released at its end

    async def _v3(self, websocket: WebSocket, early: Slot | None) -> None:
        tap_socket(websocket, self._config.trace_factory, "v3")  # tests: every frame through the trace checker
        await websocket.accept(subprotocol=safe_subprotocol(websocket.scope.get("subprotocols") or ()))
        limit_messages(websocket, self._config.v3_max_message_bytes)
        slot = early or self._admission.try_acquire()
        if slot is None:
            self._usage.reject("v3", "busy")
            await self._answer(websocket, busy_error(self._config.ids.uuid()).text, CLOSE_BUSY, "server_busy")
            return
        cfg = self._config
        core = SessionCore(cfg.session_config(cfg.ids.uuid(), typed_input_ready=self._typed_ready(),
                                              turn_policy=V3_TURN_POLICY[cfg.v3_turns]))
        protocol = V3Session(core, V3Options(default_instructions=cfg.default_instructions,
                                             single_client=cfg.max_sessions == 1,
                                             turn_policy=V3_TURN_POLICY[cfg.v3_turns],
                                             max_inbox_messages=cfg.max_inbox_messages,
                                             configure_timeout_s=cfg.v3_configure_timeout_s,
                                             idle_timeout_s=cfg.v3_idle_timeout_s),
                             tally=self._usage.admit(core.session_id, "v3", time.monotonic(),
                                                    on_error=error_logger(core.session_id)))
        try:
            await self._host.serve(websocket, protocol, "v3", slot=slot)
        finally:
            self._host.handler_done(slot, protocol.session_id)

    # ================================================================ the tiered dialect

    async def realtime(self, websocket: WebSocket) -> None:
        try:
            route = select_route(
                websocket.url.path,
                dict(websocket.query_params),
                dict(websocket.headers),
                bare_default=self._config.realtime_default,
            )
        except UnknownRoute:
            await websocket.close(1008)
            return
        early: Slot | None = None  # a slot taken before the accept: a balancer may try another replica without one
        if route.dialect != "duplex_off" and self._elsewhere(websocket):
            early = await self._slot_or_elsewhere(websocket, "v3" if route.dialect == "v3" else "tiered")
            if early is None:
                return
        try:
            if route.dialect == "v3":
                await self._v3(websocket, early)
            else:
                await self._tiered(websocket, route, early)
        finally:
            if early is not None:
                early.release()  # idempotent: a hosted session's slot is released at its end

    async def _tiered(self, websocket: WebSocket, route: Any, early: Slot | None) -> None:
        tap_socket(websocket, self._config.trace_factory, "tiered-openai" if route.lane == "openai" else "tiered")
        await websocket.accept(subprotocol=safe_subprotocol(websocket.scope.get("subprotocols") or ()))
        # A first message (session.update or session.resume) is small: a client waiting for one holds no more.
        limit_messages(websocket, self._config.tiered_max_message_bytes if route.autostart else FIRST_MESSAGE_MAX_BYTES)
        if route.dialect == "duplex_off":
            await self._answer(websocket, duplex_off_answer_text(), 1000, "unsupported")
            return
        first: str | bytes | None = None
        if not route.autostart:
            try:
                message = await asyncio.wait_for(websocket.receive(), self._config.handshake_timeout_s)
            except TimeoutError:
                await self._answer(websocket, self._error("config_timeout", "no first message in time"), 1000,
                                   "config_timeout")
                return
            if message["type"] == "websocket.disconnect":
                return
            first = message.get("text") if message.get("text") is not None else message.get("bytes")
            limit_messages(websocket, self._config.tiered_max_message_bytes)
            parsed = tiered_parser.parse(first or "")
            if isinstance(parsed, tiered_parser.SessionResume) and route.lane != "full":
                err = self._error("unsupported_session_resume", "session.resume is served on the full lane only "
                                  "(/v1/realtime?duplex=1 or /v1/duplex)", event_id=parsed.event_id)
                await self._answer(websocket, err, 1000, "unsupported_session_resume")
                return
            if isinstance(parsed, tiered_parser.SessionResume):
                if early is not None:
                    early.release()  # a resume takes no new slot: its session holds one
                await self._resume(websocket, parsed)
                return
            if isinstance(parsed, tiered_parser.ParseError) and parsed.code == "invalid_session_resume":
                err = self._error(parsed.code, parsed.message, event_id=parsed.event_id, param=parsed.param)
                await self._answer(websocket, err, 1000, parsed.code)
                return
        slot = early or self._admission.try_acquire()
        held: list[str | bytes] = []  # what a queued client sent while it waited, handed over in order
        if slot is None and self._admission.queue_capacity:
            limit_messages(websocket, QUEUED_MAX_MESSAGE_BYTES)  # no session yet: no more than a first message
            slot, reason = await self._queue_for_slot(websocket, held)
            if slot is None and reason is None:
                return  # the client left while queued
            limit_messages(websocket, self._config.tiered_max_message_bytes)
        else:
            reason = "resource_exhausted"
        if slot is None:
            self._usage.reject("tiered", reason or "resource_exhausted")
            limit = self._admission.capacity
            message = f"duplex_session_capacity_exhausted: limit={limit}"
            if reason == "draining" or self._admission.draining:
                message += "; this replica is draining"
            elif reason == "queue_full":
                message += f"; admission queue full ({self._admission.queue_capacity})"
            elif reason == "queue_timeout":
                message += f"; no slot within {self._config.admission_timeout_s:g} s in the admission queue"
            err = self._error("resource_exhausted", message, retryable=True)
            await self._answer(websocket, err, CLOSE_TRY_AGAIN_LATER, "resource_exhausted")
            return
        cfg = self._config
        openai_lane = route.lane != "full"  # OpenAI caps ids at 32 characters (LiveKit rewrites longer call ids)
        session_id = f"sess_{cfg.ids.hex(13)}" if openai_lane else keys.session_id(cfg.replica, cfg.ids.hex(16))
        core = SessionCore(cfg.session_config(
            session_id, typed_input_ready=self._typed_ready(),
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
            tally=self._usage.admit(core.session_id, "tiered", time.monotonic(),
                                   on_error=error_logger(core.session_id)),
        )
        try:
            await self._host.serve(websocket, protocol, "tiered", first=first, slot=slot, held=held)
        finally:
            self._host.handler_done(slot, protocol.session_id)

    async def _queue_for_slot(self, websocket: WebSocket, held: list[str | bytes]) -> tuple[Slot | None, str | None]:
        """Wait in the admission queue: ``session.queued`` at once, ``session.queue_update`` when the position
        changes, ``session.queue_done`` when a slot is ours. Returns (slot, None), or (None, why: ``queue_full`` /
        ``queue_timeout``) for the busy answer, or (None, None) when the client left (it leaves the queue at once)."""
        changed = asyncio.Event()
        ticket = self._admission.enqueue(changed.set)
        if ticket is None:
            return None, "queue_full"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.admission_timeout_s
        reader: asyncio.Task | None = None
        if ticket.slot is not None:  # a slot was free after all: no queue events
            return ticket.slot, None
        try:
            if not await self._send_queue_event(websocket, "session.queued", ticket.position):
                return None, None
            told = ticket.position
            held_bytes = 0
            while ticket.slot is None:
                if (reader is None and len(held) < self._config.max_inbox_messages
                        and held_bytes < self._config.max_inbox_bytes):
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
                    if data is not None and len(data) > QUEUED_MAX_MESSAGE_BYTES:
                        # Where our protocol does not serve the socket (vLLM-Omni's uvicorn) the size is checked here
                        with contextlib.suppress(Exception):
                            await websocket.close(1009)
                        return None, None
                    if data is not None:
                        held.append(data)
                        held_bytes += len(data)
                if ticket.position < 0:
                    return None, "draining"
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
            self._admission.leave(ticket)

    async def _send_queue_event(self, websocket: WebSocket, type_: str, position: int) -> bool:
        mean = self._usage.mean_duration_s()
        wait = None if mean is None or position == 0 else position * mean / self._admission.capacity
        try:
            await websocket.send_text(queue_event(type_, server_event_id=f"event_{self._config.ids.hex(6)}",
                                                  position=position, estimated_wait_s=wait))
        except Exception:  # the client left
            return False
        return True

    async def _resume(self, websocket: WebSocket, request: tiered_parser.SessionResume) -> None:
        """A resume reaches its session's owner here, or is refused at once."""
        att = self._host.live.resumable(request.session_id)
        if att is None:
            self._usage.resume_refused()
            owner, here = keys.owner_of(request.session_id), self._config.replica
            why = "no live session with that id"
            if owner is not None and owner != here:
                # Terminal at once: waiting would not bring the session here (the balancer routed the resume past
                # its owner: no session_id in the upgrade URL, or the owner is down)
                why = f"the session belongs to replica {owner}, not to this {'replica ' + here if here else 'server'}"
            await self._answer(websocket, self._error("session_resume_expired", why, event_id=request.event_id),
                               1000, "session_resume_expired")
            return
        await self._host.resume(websocket, request, att)

    @staticmethod
    def _elsewhere(websocket: WebSocket) -> bool:
        """Whether the balancer in front may send this upgrade to another replica (``fleet/keys.py``)."""
        return websocket.headers.get(keys.ADMISSION_HEADER) == keys.ELSEWHERE

    async def _slot_or_elsewhere(self, websocket: WebSocket, dialect: str) -> Slot | None:
        """A slot for a new session, or the upgrade refused with HTTP 503 before the accept (None): the balancer
        retries another replica. A host whose server cannot refuse an upgrade (no ASGI denial response) takes the
        dialect's busy answer instead, after the accept."""
        slot = self._admission.try_acquire()
        if slot is not None or "websocket.http.response" not in websocket.scope.get("extensions", {}):
            return slot
        self._usage.reject(dialect, "draining" if self._admission.draining else "elsewhere")
        why = "draining" if self._admission.draining else "no free session slot"
        with contextlib.suppress(Exception):  # the client left first
            await websocket.send_denial_response(JSONResponse({"error": {"code": "server_busy", "message": why}},
                                                              status_code=503, headers={"Retry-After": "1"}))
        return None

    def _error(self, code: str, message: str, **kw: Any) -> str:
        return handshake_error(code, message, server_event_id=f"event_{self._config.ids.hex(6)}", **kw)

    @staticmethod
    async def _answer(websocket: WebSocket, text: str, code: int, reason: str = "") -> None:
        try:
            await websocket.send_text(text)
            await websocket.close(code, reason)
        except Exception:  # the client left first
            pass
