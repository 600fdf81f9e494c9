"""An asyncio client for the strict ``voicechat.realtime`` v3 WebSocket protocol.

It behaves like the Pipecat v3 client: pings off, a checked ``session.created``, one ``session.update``
answered by the ``session.updated`` model-ready barrier, client-owned turns whose ``turn_start`` / ``commit``
barriers must be acknowledged with the same ``client_turn_id`` and ``client_event_id`` within 15 s, 80 ms
JSON/base64 PCM16 appends, typed input through ``input_text.request``, function calls, and ``session.stop``.

A background task receives every server event and hands it to the sans-I/O state machine of ``contract.py``
(:class:`~.contract.V3ClientProtocol`: what the contract lets a client check, per-turn and per-response state, the
barrier deadlines), and records the first failure: a :class:`ProtocolError` (the server broke the contract or missed
a deadline) or a fatal :class:`ServerError`. After a failure the client disconnects and every pending or later call
raises that failure. This module is the thin asyncio shell around it.

**Function calls.** Tool handlers (``tools=`` / :meth:`V3Client.register_tool`) are async callables
``(arguments: dict) -> str | (output, model_output)``. A published call
(``response.function_call_arguments.done``) opens a *function epoch*: the handler runs (bounded by
``tool_timeout``, 20 s as in Pipecat), its result is sent once as ``conversation.item.create`` and the client
waits up to 30 s for ``conversation.item.function_call_output.applied`` with the same ``call_id``;
``response.function_call.failed`` also closes the epoch. A second call while an epoch is open is a
:class:`ProtocolError`; duplicate ``call_id`` s are ignored.

**WireText arbiter.** Microphone input (``start_turn``, ``send_audio``, ``commit``) and typed requests
(``request_typed``) pass through an :class:`~.arbiter.OutboundArbiter` (``arbiter.py``). While a function epoch
is open nothing of them is sent; from a typed request until its terminal event (``rejected`` or
``injection_finished``) microphone input is held. When the hold ends, pending typed requests are admitted first; held microphone turns are released intact
after the typed injection finished. A microphone turn already on the wire (``turn_start`` sent) always runs to
its ``commit`` first. Held turn audio is bounded (1 MiB); an overflow drops the held turn with an
:class:`ArbiterCapacityError` (``arbiter_capacity``). Audio outside a turn is kept as a rolling 0.4 s pre-roll
while held. The public methods complete when their (possibly held) input was actually sent / acknowledged;
:attr:`V3Client.sent` logs every client event in wire order with what the client had received by then.

    async with await V3Client.connect("ws://127.0.0.1:8765/v1/realtime", tools={"get_weather": weather}) as client:
        await client.configure(instructions="Keep answers short.", tools=[WEATHER_SCHEMA])
        await client.start_turn(1)
        await client.send_audio(pcm16, paced=True)
        turn_id = await client.commit(1)
        response = await client.response_done((await client.response_for(turn_id)).response_id)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from ..audio.frames import INPUT_SAMPLE_RATE
from ..ids import SYSTEM_IDS, Ids
from .arbiter import HELD_INPUT_MAX_BYTES, HELD_PREROLL_SECONDS, ArbiterCapacityError, WireText, OutboundArbiter
from .contract import (
    BARRIER_ACK_TIMEOUT,
    MODEL_OUTPUT_MODE,
    OUTPUT_SAMPLE_RATE,
    PROTOCOL,
    Barrier,
    Event,
    ProtocolError,
    Response,
    RunTool,
    ServerError,
    SessionEnded,
    ToolRun,
    TypedJob,
    UserTurn,
    V3ClientError,
    V3ClientProtocol,
)
from .log import EventLog
from .tools import TOOL_HANDLER_TIMEOUT, TOOL_TIMEOUT_OUTPUT, ToolHandler, call_tool

__all__ = [
    "APPEND_BYTES", "FUNCTION_OUTPUT_ACK_TIMEOUT", "HELD_INPUT_MAX_BYTES", "OUTPUT_SAMPLE_RATE", "PROTOCOL",
    "TOOL_HANDLER_TIMEOUT", "TOOL_TIMEOUT_OUTPUT", "ArbiterCapacityError", "Event", "WireText", "OutboundArbiter",
    "ProtocolError", "Response", "Sent", "ServerError", "SessionEnded", "ToolHandler", "ToolRun", "TypedJob",
    "UserTurn", "V3Client", "V3ClientError",
]

APPEND_SECONDS = 0.08
APPEND_BYTES = 2_560  # 80 ms of 16 kHz mono PCM16
RESPONSE_CREATED_TIMEOUT = 15.0
FUNCTION_OUTPUT_ACK_TIMEOUT = 30.0  # result sent -> ...function_call_output.applied



def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a future's exception as retrieved: not every arbitrated operation has someone awaiting it."""
    if not future.cancelled():
        future.exception()


def _settle(future: asyncio.Future[bool] | None, outcome: bool | BaseException) -> None:
    if future is None or future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


@dataclass(frozen=True)
class Sent:
    """One client event as written to the socket (``V3Client.sent`` is in wire order)."""

    index: int  # position in V3Client.sent
    type: str
    event: Event
    after: int  # how many server events the client had received when it was written (an index into events)
    at: float  # event-loop time of the write
    held: bool  # the outbound arbiter held it before it could be sent


T = TypeVar("T")


class _Protocol(Generic[T]):
    """A read-only view of the client's protocol state machine."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, client: Any, owner: type | None = None) -> T:
        return getattr(client.protocol, self.name)


class V3Client(EventLog):
    """Use :meth:`connect` to create one."""

    def __init__(
        self,
        ws: ClientConnection,
        *,
        tools: Mapping[str, ToolHandler] | None = None,
        tool_timeout: float = TOOL_HANDLER_TIMEOUT,
        function_output_ack_timeout: float = FUNCTION_OUTPUT_ACK_TIMEOUT,
        max_held_bytes: int = HELD_INPUT_MAX_BYTES,
        held_preroll_seconds: float = HELD_PREROLL_SECONDS,
        ids: Ids = SYSTEM_IDS,
    ) -> None:
        if not 0 < held_preroll_seconds <= 1.0:
            raise ValueError("held_preroll_seconds must be in (0, 1]")
        super().__init__()
        self._ws = ws
        self.sent: list[Sent] = []  # every client event, in wire order
        self.client_errors: list[V3ClientError] = []  # recoverable client-side errors (arbiter_capacity)
        self.close_code: int | None = None
        self.tool_timeout = tool_timeout
        self.function_output_ack_timeout = function_output_ack_timeout
        preroll = round(INPUT_SAMPLE_RATE * 2 * held_preroll_seconds)
        arbiter = OutboundArbiter(max_held_bytes=max_held_bytes, preroll_bytes=preroll - preroll % 2)
        self.protocol = V3ClientProtocol(arbiter, ids=ids)
        self._tools: dict[str, ToolHandler] = {}
        for name, handler in (tools or {}).items():
            self.register_tool(name, handler)
        self._configured = False
        self._closing = False
        self._stopping = False
        self._receiver: asyncio.Task[None] | None = None
        self._sender: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()  # tool runs and internal ack watchers

    # ================================================================ state (the protocol's, read through)

    arbiter = _Protocol[OutboundArbiter]("arbiter")
    session_id = _Protocol[str | None]("session_id")
    capabilities = _Protocol[dict[str, Any]]("capabilities")
    session = _Protocol[dict[str, Any]]("session")  # the session description from session.updated
    model_output_mode = _Protocol[str | None]("model_output_mode")
    turns = _Protocol[dict[str, UserTurn]]("turns")
    responses = _Protocol[dict[str, Response]]("responses")
    jobs = _Protocol[dict[str, TypedJob]]("jobs")
    calls = _Protocol[dict[str, Event]]("calls")  # call_id -> function_call_arguments.done
    tool_runs = _Protocol[dict[str, ToolRun]]("tool_runs")  # call_id -> what the client did about it
    errors = _Protocol[list[ServerError]]("errors")  # recoverable server errors, in arrival order
    closed_event = _Protocol[Event | None]("closed_event")  # session.closed
    current_response = _Protocol[Response | None]("current_response")  # the open response, if any
    function_epoch = _Protocol[str | None]("function_epoch")  # the call_id of the open function epoch, if any

    # ================================================================ connection

    @classmethod
    async def connect(
        cls, url: str, *, connect_timeout: float = 15.0, created_timeout: float = 15.0, **options: Any
    ) -> V3Client:
        """Open the socket (pings off) and wait for a valid ``session.created``.

        ``options`` are the constructor's (``tools``, ``tool_timeout``, ``function_output_ack_timeout``,
        ``max_held_bytes``, ``held_preroll_seconds``, ``ids``). ``tools`` maps tool names to async handlers (see
        :meth:`register_tool`); the tool *schemas* are what :meth:`configure` advertises to the server.
        """
        ws = await ws_connect(
            url, open_timeout=connect_timeout, ping_interval=None, ping_timeout=None, max_size=None, proxy=None
        )
        client = cls(ws, **options)
        client._receiver = asyncio.create_task(client._receive())
        client._sender = asyncio.create_task(client._send_loop())
        try:
            await client._until(lambda: client.session_id, created_timeout, "session.created", fatal=True)
        except BaseException:
            await client.close()
            raise
        return client

    def register_tool(self, name: str, handler: ToolHandler) -> None:
        """Run ``handler(arguments)`` for every published call of ``name``; it returns ``output`` or
        ``(output, model_output)`` (``model_output`` is only sent when negotiated in :meth:`configure`).

        A handler that exceeds ``tool_timeout`` is cancelled and :data:`TOOL_TIMEOUT_OUTPUT` is sent instead; one
        that raises sends ``{"error":"tool_handler_failed",...}``. Calls of unregistered names are left to
        :meth:`send_tool_result`.
        """
        if not isinstance(name, str) or not name:
            raise ValueError("a tool name must be a non-empty string")
        if not callable(handler):
            raise TypeError("a tool handler must be an async callable")
        self._tools[name] = handler
        self.protocol.tool_names.add(name)

    async def configure(
        self,
        instructions: str | None = "",
        tools: list[dict[str, Any]] | None = None,
        model_output: bool = False,
        timeout: float = 45.0,
    ) -> Event:
        """Send the one ``session.update`` and wait for the ``session.updated`` model-ready barrier."""
        if self._configured:
            raise RuntimeError("configure() succeeds once per session; settings are never changed afterwards")
        advertised = self.capabilities.get("function_output_model_output")
        negotiate = model_output and isinstance(advertised, dict) and advertised.get("mode") == MODEL_OUTPUT_MODE
        session: dict[str, Any] = {"protocol_version": 3, "instructions": instructions, "tools": list(tools or [])}
        if negotiate:
            session["capabilities"] = {"function_output_model_output": MODEL_OUTPUT_MODE}
        event_id = self.protocol.new_event_id()
        since = len(self.events)
        await self._send({"type": "session.update", "event_id": event_id, "session": session})
        reply = await self.wait_for(
            lambda e: e["type"] == "session.updated" or self._echoes_error(e, event_id),
            timeout,
            since=since,
            fatal=True,
        )
        if reply["type"] == "error":
            raise self._recorded(reply)
        self.protocol.configured(reply, negotiate)
        self._configured = True
        return reply

    async def stop(self, timeout: float = 8.0) -> Event | None:
        """``session.stop`` -> wait for ``session.closed`` and the server's close (1000) -> close the socket.
        Returns ``session.closed``. Waiting for the server's close, not closing first, means the server has
        released the session (its slot is free) when this returns.

        Input still held by the arbiter is never sent; its callers get :class:`SessionEnded`.
        """
        if self.failure is None and not self._finished and self.closed_event is None:
            self._stopping = True
            self._notify()
            await self._send({"type": "session.stop", "event_id": self.protocol.new_event_id()})
            await self._until(lambda: self.closed_event, timeout, "session.closed", fatal=True)
        if self.closed_event is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ws.wait_closed(), timeout)
        await self.close()
        return self.closed_event

    async def close(self) -> None:
        """Close the socket without a ``session.stop`` and wait for the client's tasks to finish."""
        self._closing = True
        await self._ws.close()
        if self._receiver is not None:
            await asyncio.gather(self._receiver, return_exceptions=True)
        tasks = [t for t in (self._sender, *self._tasks) if t is not None and t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> V3Client:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            await self.stop()
        else:
            await self.close()

    # ================================================================ client events (through the arbiter)

    async def start_turn(self, client_turn_id: int) -> str:
        """``turn_start`` and its ``turn_started`` ack; returns the server ``turn_id``.

        Held while a function epoch is open, a typed request is pending or a typed job is in flight; the ack
        deadline (15 s) is armed when the barrier is written and paused while a function epoch is open.
        """
        if not isinstance(client_turn_id, int) or isinstance(client_turn_id, bool) or client_turn_id < 1:
            raise ValueError("client_turn_id must be an integer >= 1")
        self._check_usable()
        barrier = self.protocol.start_turn(client_turn_id)
        op = self._offer(
            WireText("turn_start", self.protocol.barrier_event(barrier), client_turn_id=client_turn_id, barrier=barrier)
        )
        await op.sent
        ack = await self._await_ack(barrier)
        if client_turn_id in self.arbiter.dropped_turns:
            raise self.arbiter.dropped_turns[client_turn_id]
        return ack["turn_id"]

    async def commit(self, client_turn_id: int) -> str:
        """``commit`` and its ``committed`` ack; returns the committed ``turn_id``.

        The turn is closed for this client at once (a next ``start_turn`` may be queued behind it).
        """
        self._check_usable()
        if client_turn_id in self.arbiter.dropped_turns:
            raise self.arbiter.dropped_turns[client_turn_id]
        barrier = self.protocol.commit(client_turn_id)
        op = self._offer(
            WireText("commit", self.protocol.barrier_event(barrier), client_turn_id=client_turn_id, barrier=barrier)
        )
        await op.sent
        ack = await self._await_ack(barrier)
        return ack["turn_id"]

    async def send_audio(self, pcm16: bytes, *, paced: bool) -> None:
        """Stream 16 kHz mono PCM16 as 80 ms appends; ``paced`` offers them on a real-time absolute schedule.

        Returns once the last append was written (or, for held audio outside a turn, dropped as stale
        pre-roll). Raises :class:`ArbiterCapacityError` when held turn audio overflows (the turn is dropped).
        """
        if len(pcm16) % 2:
            raise ValueError("PCM16 audio must have an even byte count")
        self._check_usable()
        loop = asyncio.get_running_loop()
        start = loop.time()
        last: WireText | None = None
        for i, offset in enumerate(range(0, len(pcm16), APPEND_BYTES)):
            if paced:
                delay = start + i * APPEND_SECONDS - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                self._check_usable()
            chunk = pcm16[offset : offset + APPEND_BYTES]
            event = {
                "type": "input_audio_buffer.append",
                "event_id": self.protocol.new_event_id(),
                "encoding": "pcm16",
                "sample_rate": INPUT_SAMPLE_RATE,
                "channels": 1,
                "audio": base64.b64encode(chunk).decode("ascii"),
            }
            last = self._offer(WireText("append", event, client_turn_id=self.protocol.open_turn,
                                        audio_bytes=len(chunk)))
        if last is not None:
            await last.sent

    async def request_typed(self, job_id: str, text: str, timeout: float = 15.0) -> TypedJob:
        """``input_text.request``; returns the job once it was accepted or rejected (see ``accepted``).

        Held while a function epoch is open or a microphone turn is on the wire; ``timeout`` counts from the
        write.
        """
        if job_id in self.jobs:
            raise ValueError(f"job_id {job_id!r} was already used in this session")
        self._check_usable()
        job = self.jobs[job_id] = TypedJob(job_id, text)
        event = {"type": "input_text.request", "event_id": self.protocol.new_event_id(), "job_id": job_id,
                 "text": text}
        op = self._offer(WireText("typed", event, job_id=job_id))
        await op.sent
        await self._until(lambda: job if job.accepted is not None else None, timeout, f"answer to typed job {job_id}")
        return job

    async def send_tool_result(
        self, call_id: str, output: str, model_output: str | None = None, timeout: float | None = None
    ) -> Event:
        """``conversation.item.create``; returns ``…function_call_output.applied`` (or ``function_call.failed``).

        Never held (it is what closes a function epoch). A rejection is raised as a recoverable
        :class:`ServerError`; the call stays pending server-side. Registered tool handlers call this for you.
        """
        item: dict[str, Any] = {"type": "function_call_output", "call_id": call_id, "output": output}
        if model_output is not None:
            item["model_output"] = model_output
        event_id = self.protocol.new_event_id()
        since = len(self.events)
        self.protocol.results_sent.add(call_id)
        await self._send({"type": "conversation.item.create", "event_id": event_id, "item": item})
        reply = await self.wait_for(
            lambda e: (
                e["type"] in ("conversation.item.function_call_output.applied", "response.function_call.failed")
                and e.get("call_id") == call_id
            )
            or self._echoes_error(e, event_id),
            self.function_output_ack_timeout if timeout is None else timeout,
            since=since,
            fatal=True,
        )
        if reply["type"] == "error":
            raise self._recorded(reply)
        return reply

    # ================================================================ waiting

    async def response_for(self, turn_id: str, timeout: float = RESPONSE_CREATED_TIMEOUT) -> Response:
        """The response opened for this user turn (``committed`` -> ``response.created`` within 15 s)."""
        return await self._until(
            lambda: next((r for r in self.responses.values() if r.turn_id == turn_id), None),
            timeout,
            f"response.created for {turn_id}",
            fatal=True,
        )

    async def response_done(self, response_id: str, timeout: float = 30.0) -> Response:
        """The response once its ``response.done`` arrived."""
        response = self.responses.get(response_id)
        if response is None:
            raise KeyError(f"unknown response {response_id!r}")
        what = f"response.done for {response_id}"
        return await self._until(lambda: response if response.done else None, timeout, what)

    async def tool_run_done(self, call_id: str, timeout: float = 60.0) -> ToolRun:
        """The call once its terminal (``applied`` or ``failed``) arrived."""
        return await self._until(
            lambda: run if (run := self.tool_runs.get(call_id)) is not None and run.done else None,
            timeout,
            f"the terminal of call {call_id}",
        )

    # ================================================================ internals: sending and waiting

    def _check_usable(self) -> None:
        if self.failure is not None:
            raise self.failure
        if self._finished or self.closed_event is not None or self._stopping:
            raise SessionEnded("the session has ended")

    async def _send(self, event: Event, *, held: bool = False) -> None:
        if self.failure is not None:
            raise self.failure
        if self._finished or self.closed_event is not None:
            raise SessionEnded("the session has ended")
        loop = asyncio.get_running_loop()
        self.sent.append(Sent(len(self.sent), event["type"], event, len(self.events), loop.time(), held))
        try:
            await self._ws.send(json.dumps(event, separators=(",", ":")))
        except ConnectionClosed as closed:
            if self._receiver is not None:  # let the receiver give its verdict (a fatal error, a violation)
                await asyncio.wait({self._receiver}, timeout=5)
            raise self.failure or SessionEnded(f"the socket closed: {closed}") from None

    def _offer(self, op: WireText) -> WireText:
        """Hand ``op`` to the arbiter; the send loop writes it when it is released."""
        op.sent = asyncio.get_running_loop().create_future()
        op.sent.add_done_callback(_retrieve)
        try:
            trimmed = self.arbiter.offer(op)
        except ArbiterCapacityError as error:
            _settle(op.sent, error)
            self._on_capacity_drop(error)
            raise
        for stale in trimmed:
            _settle(stale.sent, False)
        self._notify()
        return op

    def _on_capacity_drop(self, error: ArbiterCapacityError) -> None:
        self.client_errors.append(error)
        for op in error.dropped:
            _settle(op.sent, error)
        if error.closing_commit is not None:
            error.closing_commit.internal = True
            _settle(error.closing_commit.sent, error)
        if error.needs_commit and error.client_turn_id is not None:
            barrier = Barrier("commit", error.client_turn_id, self.protocol.new_event_id())
            commit = WireText(
                "commit", self.protocol.barrier_event(barrier), client_turn_id=error.client_turn_id, barrier=barrier,
                internal=True,
            )
            commit.sent = asyncio.get_running_loop().create_future()
            commit.sent.add_done_callback(_retrieve)
            self.arbiter.offer(commit)
            error.closing_commit = commit
        self.protocol.turn_dropped(error.client_turn_id)
        self._notify()

    async def _send_loop(self) -> None:
        """Write what the arbiter releases, in order; fail what is left when the session ends."""
        error: BaseException | None = None
        try:
            while self.failure is None and not self._finished and self.closed_event is None and not self._stopping:
                changed = self._changed
                op = self.arbiter.pop_ready()
                if op is None:
                    await changed.wait()
                    continue
                if op.barrier is not None:
                    self.protocol.barriers.append(op.barrier)
                try:
                    await self._send(op.event, held=op.held)
                except V3ClientError as failed:
                    _settle(op.sent, failed)
                    error = failed
                    break
                _settle(op.sent, True)
                if op.internal and op.barrier is not None:
                    self._spawn(self._watch_ack(op.barrier))
        finally:
            leftover = error or self.failure or SessionEnded("the session ended before this input was sent")
            for op in self.arbiter.clear():
                _settle(op.sent, leftover)

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _watch_ack(self, barrier: Barrier) -> None:
        try:
            await self._await_ack(barrier)
        except V3ClientError:
            pass  # recorded as the session's failure

    async def _await_ack(self, barrier: Barrier) -> Event:
        """Wait for a written barrier's ack until the protocol's deadline for it (paused during function epochs)."""
        loop = asyncio.get_running_loop()
        what = f"{barrier.ack_type} for client turn {barrier.client_turn_id}"
        while barrier.ack is None:
            if self.failure is not None:
                raise self.failure
            if self._finished:
                raise SessionEnded(f"the session ended while waiting for {what}")
            deadline = self.protocol.ack_deadline(barrier, loop.time())
            changed = self._changed
            if deadline is not None and loop.time() >= deadline:
                error = ProtocolError(f"no {what} within {BARRIER_ACK_TIMEOUT} s")
                await self._fail(error)
                raise error
            try:
                async with asyncio.timeout(None if deadline is None else deadline - loop.time()):
                    await changed.wait()
            except TimeoutError:
                pass
        return barrier.ack

    async def _fail(self, error: V3ClientError) -> None:
        if self.failure is None:
            self.failure = error
            self._notify()
        self._closing = True
        await self._ws.close()

    def _recorded(self, event: Event) -> ServerError:
        return next(error for error in self.errors if error.event is event)

    def _echoes_error(self, event: Event, event_id: str) -> bool:
        return event["type"] == "error" and event["error"].get("client_event_id") == event_id

    # ================================================================ internals: tools

    async def _run_tool(self, run: ToolRun, handler: ToolHandler) -> None:
        """Run one handler (bounded), send its result once and wait for the applied / failed terminal."""
        output, model_output = await call_tool(run, handler, self.tool_timeout)
        if self.protocol.function_epoch != run.call_id or self.failure is not None or self._finished:
            return  # the epoch already closed (function_call.failed) or the session is over
        if model_output is not None and self.model_output_mode != MODEL_OUTPUT_MODE:
            model_output = None  # not negotiated: the server would reject it
        run.output, run.model_output = output, model_output
        try:
            await self.send_tool_result(run.call_id, output, model_output)
        except ServerError as rejected:
            run.error = rejected  # recoverable: the call stays pending until the server's own timeout
        except V3ClientError:
            pass  # the session failed; that failure is recorded on the client

    # ================================================================ internals: receiving

    async def _receive(self) -> None:
        try:
            async for message in self._ws:
                event = self.protocol.decode(message)
                self.events.append(event)
                self._handle(event)
                self._notify()
        except ConnectionClosed:
            pass
        except V3ClientError as error:  # a contract violation or a fatal server error: disconnect at once
            await self._fail(error)
        finally:
            self.close_code = self._ws.close_code
            if self.failure is None and self.closed_event is None and not self._closing:
                self.failure = ProtocolError(f"the socket closed (code {self.close_code}) without session.closed")
            self._finished = True
            self._notify()

    def _handle(self, e: Event) -> None:
        for effect in self.protocol.receive(e):
            run = effect.run
            if isinstance(effect, RunTool):
                run.task = self._spawn(self._run_tool(run, self._tools[run.name]))
            elif run.task is not None:
                run.task.cancel()
