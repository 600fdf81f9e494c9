"""Hosting admitted sessions: both dialects through one path (a session loop, its socket side, its record), and a
resumed tiered session's new socket reattached to its owner.

A model with microsecond steps (the simulator) steps on the loop, its prefill and abort in a small pool all such
sessions share (no thread per session); any other model gets a one-thread executor of its own for prefill, abort and
steps, so a slow or failing session never blocks another.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from starlette.websockets import WebSocket

from ..ops.usage import UsageBook
from ..shell.aio import SessionShell
from ..wire.tiered import parser as tiered_parser
from ..wire.transport import close_reason
from .admission import Slot
from .attachment import Attachment
from .config import ServerConfig
from .heap import Heap
from .live import LiveSession, LiveSessions
from .outbox import Outbox
from .readiness import Readiness
from .reader import read_socket

log = logging.getLogger("vllm_omni_voicechat.server")
MODEL_POOL_THREADS = 4


class Host:
    def __init__(self, config: ServerConfig, usage: UsageBook, readiness: Readiness, live: LiveSessions,
                 heap: Callable[[], Heap]) -> None:
        self._config = config
        self._usage = usage
        self._readiness = readiness
        self._heap = heap
        self.live = live
        self.backpressure: deque[dict[str, Any]] = deque(maxlen=256)
        """What the last ended sessions' outboxes saw (benchmarks, tests)."""
        self.model_pool = concurrent.futures.ThreadPoolExecutor(MODEL_POOL_THREADS,
                                                                thread_name_prefix="voicechat-model")

    def outbox(self, session_id: str) -> Outbox | None:
        """The outbound queue of a live session's current socket (benchmarks, tests)."""
        record = self.live.get(session_id)
        return record.attachment.outbox if record is not None else None

    def end_all_sessions(self) -> None:
        """Server shutdown: end every session now, on the server's loop. A detached tiered session would otherwise
        wait out its disconnect grace in its ASGI task, and uvicorn's graceful shutdown waits for that task."""
        for record in self.live.hosted():
            record.shell.disconnect()

    def handler_done(self, slot: Slot, session_id: str) -> None:
        """A session's handler has returned: its slot is free and its tally ended (a backstop: it ends once). The
        session frees itself; only the heap's former policy collects after it (server/heap.py)."""
        slot.release()
        self._usage.end(session_id, "disconnect", time.monotonic())
        heap = self._heap()
        delay = heap.session_ended(time.monotonic())
        if delay is not None:
            asyncio.get_running_loop().call_later(delay, lambda: heap.collect_due(time.monotonic()))

    async def serve(self, websocket: WebSocket, protocol: Any, dialect: str, *,
                    first: str | bytes | None = None, slot: Slot | None = None,
                    held: list[str | bytes] | None = None) -> None:
        """Host an admitted session on ``websocket`` until it ends (stop, fatal error, disconnect or expiry).

        The session's ``slot`` is freed once the session has ended and its model is released, before its socket's
        close handshake: a client that has seen the close can open its next session at once."""
        cfg = self._config
        largest = cfg.v3_max_message_bytes if dialect == "v3" else cfg.tiered_max_message_bytes
        att = Attachment(protocol, cfg, fail_on_overflow=dialect == "v3", max_message_bytes=largest)
        first_outbox = att.attach(websocket)
        for item in protocol.start(time.monotonic()):
            att.sink(item)
        cleanup_failure = self._readiness.cleanup_failure
        if cleanup_failure is not None:
            # A poisoned model home: greet, then fail the session before it can touch the model.
            for item in protocol.poisoned(cleanup_failure, time.monotonic()):
                att.sink(item)
            if slot is not None:
                slot.release()
            self._usage.end(protocol.session_id, ended_reason(att), time.monotonic())
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
        lane = "v3" if dialect == "v3" else ("full" if protocol.tier3 else "openai")
        client = websocket.scope.get("client") or ("?", 0)
        log.info("session %s started: %s, lane %s, client %s:%s, user agent %r", session_id, dialect, lane,
                 client[0], client[1], websocket.headers.get("user-agent", ""))
        self.live.add(LiveSession(session_id, dialect, att, started))
        if first is not None:
            shell.submit(first)
        for message in held or ():
            shell.submit(message)
        reader = asyncio.create_task(read_socket(att, websocket))
        try:
            # A task of its own: each wake-up (a client frame, a deadline) resumes the shell's two frames, not the
            # dozen of the ASGI stack this handler runs under (~5 us a position). Cancelling this handler cancels it.
            await asyncio.create_task(shell.run())
        finally:
            att.ended.set()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            self.live.ended(session_id, time.monotonic())
            self._readiness.session_ended(session_id, shell)
            if slot is not None:
                slot.release()
            tally = self._usage.live.get(session_id)
            summary = tally.summary() if tally is not None else {}
            reason = ended_reason(att)
            self._usage.end(session_id, reason, time.monotonic())
            duration_s = time.monotonic() - started
            try:
                await att.finish()
            finally:
                self.live.remove(session_id)
            self.backpressure.append(att.stats(dialect))
            log.info("session %s ended: %s after %.1f s, %d positions, responses %s, function calls %s, errors %s, "
                     "reason %s (close %s %s)%s", session_id, dialect, duration_s, shell.positions,
                     summary.get("responses", {}), summary.get("function_calls", {}), summary.get("errors", {}),
                     tally.ended_reason if tally is not None and tally.ended_reason else reason,
                     att.close_code or 1000, att.close_label,
                     f"; model failure: {shell.model_failure}" if shell.model_failure else "")

    async def resume(self, websocket: WebSocket, request: tiered_parser.SessionResume, att: Attachment) -> None:
        """Reattach the tiered session of ``att`` (a hosted, resumable one) to ``websocket``."""
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
                        self._usage.resumed(time.monotonic() - received)  # request -> replay queued
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
        self._usage.resume_refused()
        for item in outcome.outputs:
            with contextlib.suppress(Exception):
                await websocket.send_text(item.text)
        with contextlib.suppress(Exception):
            await websocket.close(1000, _refusal_code(outcome.outputs))


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
