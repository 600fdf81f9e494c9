"""An asyncio client for the strict ``voicechat.realtime`` v3 WebSocket protocol.

It behaves like the Pipecat v3 client: pings off, a checked ``session.created``, one ``session.update``
answered by the ``session.updated`` model-ready barrier, client-owned turns whose ``turn_start`` / ``commit``
barriers must be acknowledged with the same ``client_turn_id`` and ``client_event_id`` within 15 s, 80 ms
JSON/base64 PCM16 appends, typed input through ``input_text.request``, function calls, and ``session.stop``.

A background task receives every server event, validates what the contract lets a client check, keeps
per-turn and per-response state, and records the first failure: a :class:`ProtocolError` (the server broke the
contract or missed a deadline) or a fatal :class:`ServerError`. After a failure the client disconnects and every
pending or later call raises that failure.

**Function calls.** Tool handlers (``tools=`` / :meth:`V3Client.register_tool`) are async callables
``(arguments: dict) -> str | (output, model_output)``. A published call
(``response.function_call_arguments.done``) opens a *function epoch*: the handler runs (bounded by
``tool_timeout``, 20 s as in Pipecat), its result is sent once as ``conversation.item.create`` and the client
waits up to 30 s for ``conversation.item.function_call_output.applied`` with the same ``call_id``;
``response.function_call.failed`` also closes the epoch. A second call while an epoch is open is a
:class:`ProtocolError`; duplicate ``call_id`` s are ignored.

**Outbound arbiter.** Microphone input (``start_turn``, ``send_audio``, ``commit``) and typed requests
(``request_typed``) pass through an :class:`OutboundArbiter`. While a function epoch is open nothing of them is
sent; from a typed request until its terminal event (``rejected`` or ``injection_finished``) microphone input is
held. When the hold ends, pending typed requests are admitted first; held microphone turns are released intact
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
import binascii
import json
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

PROTOCOL = {"name": "voicechat.realtime", "version": 3}
INPUT_TURN_DETECTION = "client_smart_turn_v1"
MODEL_OUTPUT_MODE = "client_authored_v1"
INPUT_SAMPLE_RATE = 16_000
OUTPUT_SAMPLE_RATE = 22_050
APPEND_SECONDS = 0.08
APPEND_BYTES = 2_560  # 80 ms of 16 kHz mono PCM16
BARRIER_ACK_TIMEOUT = 15.0
RESPONSE_CREATED_TIMEOUT = 15.0
TOOL_HANDLER_TIMEOUT = 20.0  # Pipecat's own tool handler timeout (the server waits 30 s)
FUNCTION_OUTPUT_ACK_TIMEOUT = 30.0  # result sent -> ...function_call_output.applied
HELD_INPUT_MAX_BYTES = 1024 * 1024  # held microphone turn audio per hold (epoch / typed job)
HELD_PREROLL_SECONDS = 0.4  # rolling audio kept, while held, from outside any turn
TOOL_TIMEOUT_OUTPUT = '{"error":"tool_handler_timeout"}'
RESPONSE_STATUSES = frozenset({"completed", "cancelled", "failed"})
TYPED_DISPOSITIONS = frozenset({"completed", "cancelled", "replaced", "error"})
SOURCES = frozenset({"microphone", "typed"})

Event = dict[str, Any]
Match = str | Callable[[Event], bool]
ToolResult = str | tuple[str, str | None]
ToolHandler = Callable[[dict[str, Any]], Awaitable[ToolResult]]


class V3ClientError(Exception):
    """Base class of everything this client raises for protocol-level reasons."""


class ProtocolError(V3ClientError):
    """The server broke the v3 contract (or missed one of its deadlines); the session is over."""


class SessionEnded(V3ClientError):
    """The session ended (cleanly) before what was awaited happened."""


class ServerError(V3ClientError):
    """A typed server ``error``: fatal ones end the session, recoverable ones are raised to the caller."""

    def __init__(self, event: Event) -> None:
        body = event["error"]
        self.event = event
        self.code: str = body["code"]
        self.message: str = body["message"]
        self.fatal: bool = body["fatal"]
        self.client_event_id: Any = body.get("client_event_id")
        self.details = {k: v for k, v in body.items() if k not in ("code", "message", "fatal", "client_event_id")}
        super().__init__(f"{'fatal' if self.fatal else 'recoverable'} server error {self.code}: {self.message}")


class ArbiterCapacityError(V3ClientError):
    """Client-side and recoverable: held microphone input overflowed its bound, so the held turn was dropped.

    ``dropped`` lists the held operations that were discarded (never sent). A turn whose ``turn_start`` had
    already been sent is closed by its commit (``closing_commit``, sent once the hold ends) with none of the
    held audio.
    """

    code = "arbiter_capacity"
    fatal = False

    def __init__(self, client_turn_id: int | None, limit: int, held_bytes: int) -> None:
        self.client_turn_id = client_turn_id
        self.limit = limit
        self.held_bytes = held_bytes
        self.dropped: list[Outbound] = []
        self.closing_commit: Outbound | None = None
        self.needs_commit = False
        super().__init__(
            f"arbiter_capacity: held microphone input of client turn {client_turn_id} would exceed {limit} bytes "
            f"({held_bytes} held); the held turn was dropped"
        )


@dataclass
class Response:
    turn_id: str
    response_id: str
    text: str = ""
    audio: bytearray = field(default_factory=bytearray, repr=False)
    status: str | None = None
    reason: str | None = None
    text_done: bool = False
    audio_done: bool = False

    @property
    def done(self) -> bool:
        return self.status is not None


@dataclass
class UserTurn:
    turn_id: str
    source: str  # "microphone" or "typed"
    job_id: str | None
    client_turn_id: int | None = None
    transcript: str = ""
    committed: bool = False
    completed: bool = False


@dataclass
class TypedJob:
    job_id: str
    text: str
    accepted: bool | None = None
    reason: str | None = None
    injection_started: bool = False
    turn_id: str | None = None
    disposition: str | None = None

    @property
    def active(self) -> bool:
        return bool(self.accepted) and self.disposition is None


@dataclass
class ToolRun:
    """One published function call and what the client did about it."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    handled: bool  # a handler was registered for ``name`` (otherwise answer it with send_tool_result)
    output: str | None = None  # the result sent (None: nothing sent yet)
    model_output: str | None = None
    timed_out: bool = False  # the handler exceeded the client's tool timeout
    error: BaseException | None = None  # the handler's exception, or the server's rejection of the result
    outcome: str | None = None  # "applied" or "failed" (the call's terminal event)
    terminal: Event | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False, compare=False)

    @property
    def done(self) -> bool:
        return self.outcome is not None


@dataclass(frozen=True)
class Sent:
    """One client event as written to the socket (``V3Client.sent`` is in wire order)."""

    index: int  # position in V3Client.sent
    type: str
    event: Event
    after: int  # how many server events the client had received when it was written (an index into events)
    at: float  # event-loop time of the write
    held: bool  # the outbound arbiter held it before it could be sent


@dataclass
class _Barrier:
    kind: str  # "turn_start" or "commit"
    client_turn_id: int
    event_id: str
    ack: Event | None = None

    @property
    def ack_type(self) -> str:
        return "input_audio_buffer.turn_started" if self.kind == "turn_start" else "input_audio_buffer.committed"


@dataclass(eq=False)
class Outbound:
    """One arbitrated client event: ``kind`` is ``turn_start``, ``append``, ``commit`` or ``typed``."""

    kind: str
    event: Event
    client_turn_id: int | None = None  # microphone input: the client turn it belongs to (None: outside a turn)
    job_id: str | None = None
    audio_bytes: int = 0
    barrier: _Barrier | None = None
    held: bool = False  # it could not be sent at once
    internal: bool = False  # sent on the client's own behalf (nobody awaits it)
    seq: int = 0
    sent: asyncio.Future[bool] | None = field(default=None, repr=False)  # True: written; False: dropped pre-roll

    @property
    def microphone(self) -> bool:
        return self.kind != "typed"


class OutboundArbiter:
    """Pipecat's outbound arbiter, as pure ordering state (no I/O): what may be sent next.

    * While a function epoch is open nothing is released.
    * A microphone turn whose ``turn_start`` was released runs to its ``commit`` (its appends and commit
      first; typed requests wait, the server would reject them with ``input_turn_active``).
    * Otherwise pending typed requests go first (in order), then microphone input, which is held while a typed
      job is in flight (from its request until ``rejected`` / ``injection_finished``). A typed request does not
      wait for an earlier typed job: the server replaces it (not yet injecting) or queues behind it.
    * Held turn audio is bounded by ``max_held_bytes``; an overflow drops the held turn. Held audio from
      outside any turn is a rolling pre-roll of ``preroll_bytes``.
    """

    def __init__(self, *, max_held_bytes: int = HELD_INPUT_MAX_BYTES, preroll_bytes: int | None = None) -> None:
        if preroll_bytes is None:
            preroll_bytes = round(INPUT_SAMPLE_RATE * 2 * HELD_PREROLL_SECONDS)
        if max_held_bytes <= 0 or preroll_bytes <= 0:
            raise ValueError("held input bounds must be positive")
        self.max_held_bytes = max_held_bytes
        self.preroll_bytes = preroll_bytes
        self.epoch: str | None = None  # the open function call
        self.typed_in_flight: list[str] = []  # job ids released and not yet terminal
        self.wire_turn: int | None = None  # client turn whose turn_start was released but not its commit
        self.dropped_turns: dict[int, ArbiterCapacityError] = {}
        self.trimmed_preroll_bytes = 0
        self._mic: list[Outbound] = []
        self._typed: list[Outbound] = []
        self._seq = 0

    # --- state changes

    def open_epoch(self, call_id: str) -> None:
        self.epoch = call_id

    def close_epoch(self, call_id: str | None = None) -> None:
        if call_id is None or call_id == self.epoch:
            self.epoch = None

    def typed_finished(self, job_id: str) -> None:
        if job_id in self.typed_in_flight:
            self.typed_in_flight.remove(job_id)

    # --- queries

    def pending(self) -> list[Outbound]:
        """Every queued (not yet released) operation, in the order it was offered."""
        return sorted(self._mic + self._typed, key=lambda op: op.seq)

    @property
    def held_bytes(self) -> int:
        return sum(op.audio_bytes for op in self._mic)

    def hold_reason(self) -> str | None:
        """Why microphone input offered now would be held (None: it would go out at once)."""
        if self.epoch is not None:
            return f"function epoch {self.epoch}"
        if self.wire_turn is not None:
            return None
        if self._typed:
            return "typed request pending"
        if self.typed_in_flight:
            return f"typed job {self.typed_in_flight[0]} in flight"
        return None

    # --- offering and releasing

    def offer(self, op: Outbound) -> list[Outbound]:
        """Queue ``op``; returns queued pre-roll appends trimmed to make room (they will never be sent).

        Raises :class:`ArbiterCapacityError` (with the dropped operations; ``op`` itself is not queued) when
        held turn audio would exceed ``max_held_bytes``.
        """
        self._seq += 1
        op.seq = self._seq
        blocked = self.hold_reason() is not None
        op.held = self.epoch is not None or (blocked if op.microphone else self.wire_turn is not None)
        if not op.microphone:
            self._typed.append(op)
            return []
        if op.kind == "append" and blocked:
            if op.client_turn_id is None:
                self._mic.append(op)
                return self._trim_preroll()
            held = self.held_bytes
            if held + op.audio_bytes > self.max_held_bytes:
                raise self._drop_turn(op.client_turn_id, held)
        self._mic.append(op)
        return []

    def pop_ready(self) -> Outbound | None:
        """The next operation to send now, if any (it leaves the queue and updates the wire state)."""
        op: Outbound | None = None
        if self.epoch is None:
            if self.wire_turn is not None:
                if self._mic:
                    op = self._mic.pop(0)
            elif self._typed:
                op = self._typed.pop(0)
            elif self._mic and not self.typed_in_flight:
                op = self._mic.pop(0)
        if op is None:
            for waiting in self._mic + self._typed:
                waiting.held = True
            return None
        if op.kind == "typed":
            self.typed_in_flight.append(op.job_id)
        elif op.kind == "turn_start":
            self.wire_turn = op.client_turn_id
        elif op.kind == "commit":
            self.wire_turn = None
        return op

    def clear(self) -> list[Outbound]:
        """Remove and return everything queued (the session ended)."""
        ops = self.pending()
        self._mic.clear()
        self._typed.clear()
        return ops

    # --- internals

    def _trim_preroll(self) -> list[Outbound]:
        tail = 0
        while tail < len(self._mic):
            op = self._mic[-1 - tail]
            if op.kind != "append" or op.client_turn_id is not None:
                break
            tail += 1
        segment = self._mic[len(self._mic) - tail :]
        trimmed: list[Outbound] = []
        total = sum(op.audio_bytes for op in segment)
        while total > self.preroll_bytes and len(segment) > 1:
            oldest = segment.pop(0)
            self._mic.remove(oldest)
            total -= oldest.audio_bytes
            trimmed.append(oldest)
        self.trimmed_preroll_bytes += sum(op.audio_bytes for op in trimmed)
        return trimmed

    def _drop_turn(self, client_turn_id: int, held: int) -> ArbiterCapacityError:
        error = ArbiterCapacityError(client_turn_id, self.max_held_bytes, held)
        on_wire = self.wire_turn == client_turn_id
        kept: list[Outbound] = []
        for op in self._mic:
            if op.client_turn_id != client_turn_id:
                kept.append(op)
            elif on_wire and op.kind == "commit":
                error.closing_commit = op  # still sent: it closes the turn the server already opened
                kept.append(op)
            else:
                error.dropped.append(op)
        self._mic = kept
        error.needs_commit = on_wire and error.closing_commit is None
        self.dropped_turns[client_turn_id] = error
        return error


def new_event_id() -> str:
    return f"client_evt_{uuid.uuid4().hex}"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ProtocolError(message)


def _string(event: Event, key: str) -> str:
    value = event.get(key)
    _require(isinstance(value, str) and value != "", f"{event['type']}: {key} must be a non-empty string")
    return value


def _matcher(match: Match) -> Callable[[Event], bool]:
    return (lambda e: e["type"] == match) if isinstance(match, str) else match


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


def _tool_result(result: Any) -> tuple[str, str | None]:
    if isinstance(result, str):
        return result, None
    if (
        isinstance(result, tuple)
        and len(result) == 2
        and isinstance(result[0], str)
        and (result[1] is None or isinstance(result[1], str))
    ):
        return result[0], result[1]
    raise TypeError(f"a tool handler must return str or (output, model_output), not {type(result).__name__}")


class V3Client:
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
    ) -> None:
        if not 0 < held_preroll_seconds <= 1.0:
            raise ValueError("held_preroll_seconds must be in (0, 1]")
        self._ws = ws
        self.events: list[Event] = []
        self.sent: list[Sent] = []  # every client event, in wire order
        self.session_id: str | None = None
        self.capabilities: dict[str, Any] = {}
        self.session: dict[str, Any] = {}  # the session description from session.updated
        self.model_output_mode: str | None = None
        self.turns: dict[str, UserTurn] = {}
        self.responses: dict[str, Response] = {}
        self.jobs: dict[str, TypedJob] = {}
        self.calls: dict[str, Event] = {}  # call_id -> function_call_arguments.done
        self.tool_runs: dict[str, ToolRun] = {}  # call_id -> what the client did about it
        self.errors: list[ServerError] = []  # recoverable errors, in arrival order
        self.client_errors: list[V3ClientError] = []  # recoverable client-side errors (arbiter_capacity)
        self.closed_event: Event | None = None  # session.closed
        self.failure: V3ClientError | None = None
        self.close_code: int | None = None
        self.tool_timeout = tool_timeout
        self.function_output_ack_timeout = function_output_ack_timeout
        preroll = round(INPUT_SAMPLE_RATE * 2 * held_preroll_seconds)
        self.arbiter = OutboundArbiter(max_held_bytes=max_held_bytes, preroll_bytes=preroll - preroll % 2)
        self._tools: dict[str, ToolHandler] = {}
        for name, handler in (tools or {}).items():
            self.register_tool(name, handler)
        self._event_ids: set[str] = set()
        self._current: Response | None = None
        self._open_call: str | None = None
        self._results_sent: set[str] = set()
        self._barriers: deque[_Barrier] = deque()  # written barriers awaiting their acks, in order
        self._open_turn: int | None = None
        self._last_client_turn_id = 0
        self._configured = False
        self._closing = False
        self._stopping = False
        self._finished = False
        self._changed = asyncio.Event()
        self._receiver: asyncio.Task[None] | None = None
        self._sender: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()  # tool runs and internal ack watchers

    # ================================================================ connection

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        connect_timeout: float = 15.0,
        created_timeout: float = 15.0,
        tools: Mapping[str, ToolHandler] | None = None,
        tool_timeout: float = TOOL_HANDLER_TIMEOUT,
        function_output_ack_timeout: float = FUNCTION_OUTPUT_ACK_TIMEOUT,
        max_held_bytes: int = HELD_INPUT_MAX_BYTES,
        held_preroll_seconds: float = HELD_PREROLL_SECONDS,
    ) -> V3Client:
        """Open the socket (pings off) and wait for a valid ``session.created``.

        ``tools`` maps tool names to async handlers (see :meth:`register_tool`); the tool *schemas* are what
        :meth:`configure` advertises to the server.
        """
        ws = await ws_connect(
            url, open_timeout=connect_timeout, ping_interval=None, ping_timeout=None, max_size=None, proxy=None
        )
        client = cls(
            ws,
            tools=tools,
            tool_timeout=tool_timeout,
            function_output_ack_timeout=function_output_ack_timeout,
            max_held_bytes=max_held_bytes,
            held_preroll_seconds=held_preroll_seconds,
        )
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
        event_id = new_event_id()
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
        body = reply.get("session")
        _require(isinstance(body, dict), "session.updated: session must be an object")
        _require(body.get("protocol_version") == 3, "session.updated: session.protocol_version must be 3")
        _require(body.get("id") == self.session_id, "session.updated: session.id changed")
        caps = body.get("capabilities") or {}
        mode = caps.get("function_output_model_output") if isinstance(caps, dict) else None
        expected = MODEL_OUTPUT_MODE if negotiate else None
        _require(mode == expected, f"session.updated: function_output_model_output is {mode!r}, expected {expected!r}")
        self.session = body
        self.model_output_mode = mode
        self._configured = True
        return reply

    async def stop(self, timeout: float = 8.0) -> Event | None:
        """``session.stop`` -> wait for ``session.closed`` -> close the socket. Returns ``session.closed``.

        Input still held by the arbiter is never sent; its callers get :class:`SessionEnded`.
        """
        if self.failure is None and not self._finished and self.closed_event is None:
            self._stopping = True
            self._notify()
            await self._send({"type": "session.stop", "event_id": new_event_id()})
            await self._until(lambda: self.closed_event, timeout, "session.closed", fatal=True)
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
        if client_turn_id <= self._last_client_turn_id:
            raise ValueError(f"client_turn_id must increase (last was {self._last_client_turn_id})")
        if self._open_turn is not None:
            raise RuntimeError(f"client turn {self._open_turn} is still open; turns never overlap")
        self._last_client_turn_id = self._open_turn = client_turn_id
        barrier = _Barrier("turn_start", client_turn_id, new_event_id())
        op = self._offer(
            Outbound("turn_start", self._barrier_event(barrier), client_turn_id=client_turn_id, barrier=barrier)
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
        if client_turn_id != self._open_turn:
            raise RuntimeError(f"client turn {client_turn_id} is not the open turn ({self._open_turn})")
        self._open_turn = None
        barrier = _Barrier("commit", client_turn_id, new_event_id())
        op = self._offer(
            Outbound("commit", self._barrier_event(barrier), client_turn_id=client_turn_id, barrier=barrier)
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
        last: Outbound | None = None
        for i, offset in enumerate(range(0, len(pcm16), APPEND_BYTES)):
            if paced:
                delay = start + i * APPEND_SECONDS - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                self._check_usable()
            chunk = pcm16[offset : offset + APPEND_BYTES]
            event = {
                "type": "input_audio_buffer.append",
                "event_id": new_event_id(),
                "encoding": "pcm16",
                "sample_rate": INPUT_SAMPLE_RATE,
                "channels": 1,
                "audio": base64.b64encode(chunk).decode("ascii"),
            }
            last = self._offer(Outbound("append", event, client_turn_id=self._open_turn, audio_bytes=len(chunk)))
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
        event = {"type": "input_text.request", "event_id": new_event_id(), "job_id": job_id, "text": text}
        op = self._offer(Outbound("typed", event, job_id=job_id))
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
        event_id = new_event_id()
        since = len(self.events)
        self._results_sent.add(call_id)
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

    async def wait_for(self, match: Match, timeout: float = 15.0, *, since: int = 0, fatal: bool = False) -> Event:
        """The first received event at index ``>= since`` of :attr:`events` that matches (a type or a predicate).

        Already received events count, so there is no race with the receiver. On timeout raises
        :class:`TimeoutError`, or with ``fatal`` fails the session with a :class:`ProtocolError`.
        """
        matches = _matcher(match)
        cursor = since

        def find() -> Event | None:
            nonlocal cursor
            while cursor < len(self.events):
                event = self.events[cursor]
                cursor += 1
                if matches(event):
                    return event
            return None

        return await self._until(find, timeout, f"an event matching {match!r}", fatal=fatal)

    async def wait_until(self, check: Callable[[], Any], timeout: float = 15.0) -> Any:
        """Wait until ``check()`` is truthy, re-checked after every received event and every arbiter change."""
        return await self._until(lambda: check() or None, timeout, "the awaited condition")

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

    @property
    def current_response(self) -> Response | None:
        """The open response, if any."""
        return self._current

    @property
    def function_epoch(self) -> str | None:
        """The ``call_id`` of the open function epoch, if any."""
        return self._open_call

    def __aiter__(self) -> AsyncIterator[Event]:
        return self.iter_events()

    async def iter_events(self, since: int = 0) -> AsyncIterator[Event]:
        """Every received event from index ``since``, live; ends when the session ends, raising its failure."""
        i = since
        while True:
            while i < len(self.events):
                yield self.events[i]
                i += 1
            if self._finished:
                if self.failure is not None:
                    raise self.failure
                return
            await self._changed.wait()

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

    @staticmethod
    def _barrier_event(barrier: _Barrier) -> Event:
        return {
            "type": f"input_audio_buffer.{barrier.kind}",
            "event_id": barrier.event_id,
            "client_turn_id": barrier.client_turn_id,
        }

    def _offer(self, op: Outbound) -> Outbound:
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
            barrier = _Barrier("commit", error.client_turn_id, new_event_id())
            commit = Outbound(
                "commit", self._barrier_event(barrier), client_turn_id=error.client_turn_id, barrier=barrier,
                internal=True,
            )
            commit.sent = asyncio.get_running_loop().create_future()
            commit.sent.add_done_callback(_retrieve)
            self.arbiter.offer(commit)
            error.closing_commit = commit
        if self._open_turn == error.client_turn_id:
            self._open_turn = None
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
                    self._barriers.append(op.barrier)
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

    async def _watch_ack(self, barrier: _Barrier) -> None:
        try:
            await self._await_ack(barrier)
        except V3ClientError:
            pass  # recorded as the session's failure

    async def _await_ack(self, barrier: _Barrier) -> Event:
        """Wait for a written barrier's ack: 15 s, paused while a function epoch is open (the server defers the
        barrier until the epoch closes) and re-armed when it closes."""
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        what = f"{barrier.ack_type} for client turn {barrier.client_turn_id}"
        while barrier.ack is None:
            if self.failure is not None:
                raise self.failure
            if self._finished:
                raise SessionEnded(f"the session ended while waiting for {what}")
            if self._open_call is not None:
                deadline = None
            elif deadline is None:
                deadline = loop.time() + BARRIER_ACK_TIMEOUT
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

    async def _until(self, check: Callable[[], Any], timeout: float, what: str, *, fatal: bool = False) -> Any:
        """Wait until ``check()`` is not None, re-checking after every received event."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    result = check()
                    if result is not None:
                        return result
                    if self.failure is not None:
                        raise self.failure
                    if self._finished:
                        raise SessionEnded(f"the session ended while waiting for {what}")
                    await self._changed.wait()
        except TimeoutError:
            if not fatal:
                raise TimeoutError(f"no {what} within {timeout} s") from None
            error = ProtocolError(f"no {what} within {timeout} s")
            await self._fail(error)
            raise error from None

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

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
        try:
            try:
                async with asyncio.timeout(self.tool_timeout) as scope:
                    result = await handler(dict(run.arguments))
                output, model_output = _tool_result(result)
            except TimeoutError:
                if not scope.expired():
                    raise
                run.timed_out = True
                output, model_output = TOOL_TIMEOUT_OUTPUT, None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failing tool is reported to the model, not to the session
            run.error = exc
            output = json.dumps({"error": "tool_handler_failed", "type": type(exc).__name__}, separators=(",", ":"))
            model_output = None
        if self._open_call != run.call_id or self.failure is not None or self._finished:
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
                if isinstance(message, bytes):
                    raise ProtocolError("the server sent a binary frame")
                try:
                    event = json.loads(message)
                except ValueError:
                    raise ProtocolError(f"the server sent invalid JSON: {message[:80]!r}") from None
                _require(isinstance(event, dict) and isinstance(event.get("type"), str), "an event needs a string type")
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
        type_ = e["type"]
        event_id = e.get("event_id")
        _require(isinstance(event_id, str) and event_id != "", f"{type_}: event_id must be a non-empty string")
        _require(event_id not in self._event_ids, f"{type_}: duplicate event_id {event_id}")
        self._event_ids.add(event_id)
        if self.session_id is None:
            _require(type_ in ("session.created", "error"), f"the first event must be session.created, not {type_}")
        else:
            _require(type_ != "session.created", "a second session.created")
            _require(e.get("session_id") == self.session_id, f"{type_}: session_id {e.get('session_id')!r} changed")
        handler = _HANDLERS.get(type_)
        if handler is not None:
            handler(self, e)

    # --- session and errors

    def _on_created(self, e: Event) -> None:
        _require(e.get("protocol") == PROTOCOL, f"session.created: protocol {e.get('protocol')!r} is not {PROTOCOL}")
        caps = e.get("capabilities")
        _require(isinstance(caps, dict), "session.created: capabilities must be an object")
        detection = caps.get("input_turn_detection")
        _require(detection == INPUT_TURN_DETECTION, f"session.created: input_turn_detection is {detection!r}")
        session = e.get("session")
        _require(isinstance(session, dict), "session.created: session must be an object")
        session_id = _string(e, "session_id")
        _require(session.get("id") == session_id, "session.created: session.id differs from session_id")
        self.capabilities = caps
        self.session_id = session_id

    def _on_error(self, e: Event) -> None:
        body = e.get("error")
        _require(isinstance(body, dict), "error: error must be an object")
        _require(isinstance(body.get("code"), str) and isinstance(body.get("message"), str), "error: code/message")
        _require(isinstance(body.get("fatal"), bool), "error: fatal must be a boolean")
        error = ServerError(e)
        if error.fatal:
            raise error
        self.errors.append(error)

    def _on_closed(self, e: Event) -> None:
        _require(e.get("status") in ("completed", "failed"), f"session.closed: status {e.get('status')!r}")
        self.closed_event = e

    # --- user turns

    def _turn(self, e: Event) -> UserTurn:
        turn_id = _string(e, "turn_id")
        turn = self.turns.get(turn_id)
        _require(turn is not None, f"{e['type']}: unknown turn_id {turn_id}")
        _require(e.get("source", turn.source) == turn.source, f"{e['type']}: source differs from the turn's")
        _require(e.get("job_id", turn.job_id) == turn.job_id, f"{e['type']}: job_id differs from the turn's")
        return turn

    def _on_speech_started(self, e: Event) -> None:
        turn_id, source, job_id = _string(e, "turn_id"), e.get("source"), e.get("job_id")
        _require(source in SOURCES, f"speech_started: source {source!r}")
        _require(turn_id not in self.turns, f"speech_started: turn {turn_id} already started")
        _require(self._current is None, "speech_started while a response is open (its cancel terminal comes first)")
        if source == "microphone":
            barrier = self._barriers[0] if self._barriers else None
            _require(job_id is None, "speech_started: a microphone turn has job_id null")
            _require(
                barrier is not None and barrier.kind == "turn_start" and e.get("correlation") == barrier.client_turn_id,
                "speech_started: no matching turn_start is pending",
            )
        else:
            job = self.jobs.get(job_id)
            _require(job is not None and job.injection_started, f"speech_started: typed job {job_id!r} not injecting")
            _require(e.get("correlation") == job_id, "speech_started: a typed turn is correlated by its job_id")
            job.turn_id = turn_id
        self.turns[turn_id] = UserTurn(turn_id, source, job_id)

    def _on_barrier_ack(self, e: Event) -> None:
        barrier = self._barriers[0] if self._barriers else None
        _require(barrier is not None and barrier.ack_type == e["type"], f"{e['type']} without a pending barrier")
        _require(e.get("client_turn_id") == barrier.client_turn_id, f"{e['type']}: client_turn_id mismatch")
        _require(e.get("client_event_id") == barrier.event_id, f"{e['type']}: client_event_id mismatch")
        turn = self._turn(e)
        _require(turn.source == "microphone", f"{e['type']}: turn {turn.turn_id} is not a microphone turn")
        if barrier.kind == "turn_start":
            _require(turn.client_turn_id is None, f"turn_started: turn {turn.turn_id} was already acknowledged")
            turn.client_turn_id = barrier.client_turn_id
        else:
            _require(turn.client_turn_id == barrier.client_turn_id, "committed: turn_id is not the started turn's")
            turn.committed = True
        self._barriers.popleft()
        barrier.ack = e

    def _on_transcript_delta(self, e: Event) -> None:
        turn = self._turn(e)
        delta, transcript = e.get("delta"), e.get("transcript")
        _require(isinstance(delta, str) and transcript == turn.transcript + delta, "transcript delta: not cumulative")
        turn.transcript = transcript

    def _on_speech_stopped(self, e: Event) -> None:
        self._turn(e)

    def _on_transcript_completed(self, e: Event) -> None:
        turn = self._turn(e)
        transcript = e.get("transcript")
        _require(isinstance(transcript, str), "transcription.completed: transcript must be a string")
        _require(e.get("empty") == (transcript == ""), "transcription.completed: empty disagrees with transcript")
        turn.transcript, turn.completed = transcript, True

    # --- responses

    def _response(self, e: Event) -> Response:
        current = self._current
        _require(current is not None, f"{e['type']} while no response is open")
        _require(e.get("response_id") == current.response_id, f"{e['type']}: response_id is not the open response's")
        _require(e.get("turn_id") == current.turn_id, f"{e['type']}: turn_id is not the open response's")
        return current

    def _on_response_created(self, e: Event) -> None:
        response_id, turn_id = _string(e, "response_id"), _string(e, "turn_id")
        if self._current is not None:
            _require(response_id == self._current.response_id, f"response.created {response_id} while another is open")
            return
        _require(response_id not in self.responses, f"response.created reuses finished response {response_id}")
        turn = self.turns.get(turn_id)
        _require(turn is not None and turn.completed, f"response.created for {turn_id} before its turn completed")
        _require(turn.source == "typed" or turn.committed, f"response.created for {turn_id} before committed")
        self._current = self.responses[response_id] = Response(turn_id, response_id)

    def _on_text_delta(self, e: Event) -> None:
        response = self._response(e)
        delta = e.get("delta")
        _require(not response.text_done, "output_text.delta after output_text.done")
        _require(isinstance(delta, str) and e.get("text") == response.text + delta, "output_text.delta: not cumulative")
        response.text += delta

    def _on_audio_delta(self, e: Event) -> None:
        response = self._response(e)
        _require(not response.audio_done, "output_audio.delta after output_audio.done")
        fmt = (e.get("encoding"), e.get("sample_rate"), e.get("channels"))
        _require(fmt == ("pcm16", OUTPUT_SAMPLE_RATE, 1), f"output_audio.delta declares {fmt}, not pcm16/22050/1")
        _require(isinstance(e.get("delta"), str), "output_audio.delta: delta must be a base64 string")
        try:
            pcm = base64.b64decode(e["delta"], validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError("output_audio.delta: invalid base64") from None
        _require(len(pcm) % 2 == 0, "output_audio.delta: odd PCM16 byte count")
        response.audio.extend(pcm)

    def _on_text_done(self, e: Event) -> None:
        response = self._response(e)
        _require(not response.text_done, "a second output_text.done")
        _require(e.get("text") == response.text, "output_text.done: text differs from the deltas")
        _require(e.get("empty") == (response.text == ""), "output_text.done: wrong empty flag")
        response.text_done = True

    def _on_audio_done(self, e: Event) -> None:
        response = self._response(e)
        _require(not response.audio_done, "a second output_audio.done")
        _require(e.get("empty") == (not response.audio), "output_audio.done: wrong empty flag")
        response.audio_done = True

    def _on_response_done(self, e: Event) -> None:
        response = self._response(e)
        status, reason = e.get("status"), e.get("reason")
        _require(status in RESPONSE_STATUSES, f"response.done: status {status!r}")
        _require(reason is None or isinstance(reason, str), "response.done: reason must be a string")
        _require(response.text_done and response.audio_done, "response.done before both output done events")
        response.status, response.reason = status, reason
        self._current = None

    # --- function calls

    def _on_function_call(self, e: Event) -> None:
        self._response(e)
        call_id, name, arguments = _string(e, "call_id"), _string(e, "name"), e.get("arguments")
        if call_id in self.calls:
            return  # duplicates are ignored
        _require(self._open_call is None, f"function call {call_id} while {self._open_call} is open")
        _require(isinstance(arguments, str), "function_call_arguments.done: arguments must be a string")
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        _require(isinstance(parsed, dict), "function_call_arguments.done: arguments must be a JSON object")
        self.calls[call_id] = e
        self._open_call = call_id
        self.arbiter.open_epoch(call_id)  # hold microphone input and typed requests
        handler = self._tools.get(name)
        run = self.tool_runs[call_id] = ToolRun(call_id, name, parsed, handled=handler is not None)
        if handler is not None:
            run.task = self._spawn(self._run_tool(run, handler))

    def _on_call_terminal(self, e: Event) -> None:
        call_id = e.get("call_id")
        _require(call_id == self._open_call, f"{e['type']}: call_id {call_id!r} is not the open call's")
        applied = e["type"] == "conversation.item.function_call_output.applied"
        _require(not applied or call_id in self._results_sent, f"applied for {call_id} before its result was sent")
        self._open_call = None
        self.arbiter.close_epoch(call_id)
        run = self.tool_runs[call_id]
        run.outcome, run.terminal = ("applied" if applied else "failed"), e
        if run.output is None and run.task is not None:
            run.task.cancel()  # the server gave up waiting: a late result would only be rejected

    # --- typed input

    def _job(self, e: Event) -> TypedJob:
        job = self.jobs.get(e.get("job_id"))
        _require(job is not None, f"{e['type']}: unknown job_id {e.get('job_id')!r}")
        return job

    def _on_typed_answer(self, e: Event) -> None:
        job = self._job(e)
        _require(job.accepted is None, f"{e['type']}: job {job.job_id} was already answered")
        job.accepted = e["type"] == "input_text.accepted"
        if not job.accepted:
            job.reason = e.get("reason")
            self.arbiter.typed_finished(job.job_id)  # a rejection is the job's terminal

    def _on_injection_started(self, e: Event) -> None:
        job = self._job(e)
        _require(job.accepted and not job.injection_started, f"injection_started: job {job.job_id} not startable")
        job.injection_started = True

    def _on_injection_finished(self, e: Event) -> None:
        job = self._job(e)
        disposition = e.get("disposition")
        _require(job.accepted and job.disposition is None, f"injection_finished: job {job.job_id} is not active")
        _require(disposition in TYPED_DISPOSITIONS, f"injection_finished: disposition {disposition!r}")
        job.disposition = disposition
        self.arbiter.typed_finished(job.job_id)  # releases held microphone input


_HANDLERS: dict[str, Callable[[V3Client, Event], None]] = {
    "session.created": V3Client._on_created,
    "error": V3Client._on_error,
    "session.closed": V3Client._on_closed,
    "input_audio_buffer.speech_started": V3Client._on_speech_started,
    "input_audio_buffer.turn_started": V3Client._on_barrier_ack,
    "input_audio_buffer.committed": V3Client._on_barrier_ack,
    "conversation.item.input_audio_transcription.delta": V3Client._on_transcript_delta,
    "input_audio_buffer.speech_stopped": V3Client._on_speech_stopped,
    "conversation.item.input_audio_transcription.completed": V3Client._on_transcript_completed,
    "response.created": V3Client._on_response_created,
    "response.output_text.delta": V3Client._on_text_delta,
    "response.output_audio.delta": V3Client._on_audio_delta,
    "response.output_text.done": V3Client._on_text_done,
    "response.output_audio.done": V3Client._on_audio_done,
    "response.done": V3Client._on_response_done,
    "response.function_call_arguments.done": V3Client._on_function_call,
    "conversation.item.function_call_output.applied": V3Client._on_call_terminal,
    "response.function_call.failed": V3Client._on_call_terminal,
    "input_text.accepted": V3Client._on_typed_answer,
    "input_text.rejected": V3Client._on_typed_answer,
    "input_text.injection_started": V3Client._on_injection_started,
    "input_text.injection_finished": V3Client._on_injection_finished,
}
