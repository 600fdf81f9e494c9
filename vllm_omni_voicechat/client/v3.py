"""An asyncio client for the strict ``voicechat.realtime`` v3 WebSocket protocol.

It behaves like the Pipecat v3 client: pings off, a checked ``session.created``, one ``session.update``
answered by the ``session.updated`` model-ready barrier, client-owned turns whose ``turn_start`` / ``commit``
barriers must be acknowledged with the same ``client_turn_id`` and ``client_event_id`` within 15 s, 80 ms
JSON/base64 PCM16 appends, typed input through ``input_text.request``, and ``session.stop``.

A background task receives every server event, validates what the contract lets a client check, keeps
per-turn and per-response state, and records the first failure: a :class:`ProtocolError` (the server broke the
contract or missed a deadline) or a fatal :class:`ServerError`. After a failure the client disconnects and every
pending or later call raises that failure.

    async with await V3Client.connect("ws://127.0.0.1:8765/v1/realtime") as client:
        await client.configure(instructions="Keep answers short.")
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
from collections.abc import AsyncIterator, Callable
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
RESPONSE_STATUSES = frozenset({"completed", "cancelled", "failed"})
TYPED_DISPOSITIONS = frozenset({"completed", "cancelled", "replaced", "error"})
SOURCES = frozenset({"microphone", "typed"})

Event = dict[str, Any]
Match = str | Callable[[Event], bool]


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
class _Barrier:
    kind: str  # "turn_start" or "commit"
    client_turn_id: int
    event_id: str
    ack: Event | None = None

    @property
    def ack_type(self) -> str:
        return "input_audio_buffer.turn_started" if self.kind == "turn_start" else "input_audio_buffer.committed"


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


class V3Client:
    """Use :meth:`connect` to create one."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self.events: list[Event] = []
        self.session_id: str | None = None
        self.capabilities: dict[str, Any] = {}
        self.session: dict[str, Any] = {}  # the session description from session.updated
        self.model_output_mode: str | None = None
        self.turns: dict[str, UserTurn] = {}
        self.responses: dict[str, Response] = {}
        self.jobs: dict[str, TypedJob] = {}
        self.calls: dict[str, Event] = {}  # call_id -> function_call_arguments.done
        self.errors: list[ServerError] = []  # recoverable errors, in arrival order
        self.closed_event: Event | None = None  # session.closed
        self.failure: V3ClientError | None = None
        self.close_code: int | None = None
        self._event_ids: set[str] = set()
        self._current: Response | None = None
        self._open_call: str | None = None
        self._barrier: _Barrier | None = None
        self._open_turn: int | None = None
        self._last_client_turn_id = 0
        self._configured = False
        self._closing = False
        self._finished = False
        self._changed = asyncio.Event()
        self._receiver: asyncio.Task[None] | None = None

    # ================================================================ connection

    @classmethod
    async def connect(cls, url: str, *, connect_timeout: float = 15.0, created_timeout: float = 15.0) -> V3Client:
        """Open the socket (pings off) and wait for a valid ``session.created``."""
        ws = await ws_connect(
            url, open_timeout=connect_timeout, ping_interval=None, ping_timeout=None, max_size=None, proxy=None
        )
        client = cls(ws)
        client._receiver = asyncio.create_task(client._receive())
        try:
            await client._until(lambda: client.session_id, created_timeout, "session.created", fatal=True)
        except BaseException:
            await client.close()
            raise
        return client

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
        """``session.stop`` -> wait for ``session.closed`` -> close the socket. Returns ``session.closed``."""
        if self.failure is None and not self._finished and self.closed_event is None:
            await self._send({"type": "session.stop", "event_id": new_event_id()})
            await self._until(lambda: self.closed_event, timeout, "session.closed", fatal=True)
        await self.close()
        return self.closed_event

    async def close(self) -> None:
        """Close the socket without a ``session.stop`` and wait for the receiver to finish."""
        self._closing = True
        await self._ws.close()
        if self._receiver is not None:
            await asyncio.gather(self._receiver, return_exceptions=True)

    async def __aenter__(self) -> V3Client:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            await self.stop()
        else:
            await self.close()

    # ================================================================ client events

    async def start_turn(self, client_turn_id: int) -> str:
        """``turn_start`` and its ``turn_started`` ack; returns the server ``turn_id``."""
        if not isinstance(client_turn_id, int) or isinstance(client_turn_id, bool) or client_turn_id < 1:
            raise ValueError("client_turn_id must be an integer >= 1")
        if client_turn_id <= self._last_client_turn_id:
            raise ValueError(f"client_turn_id must increase (last was {self._last_client_turn_id})")
        if self._open_turn is not None:
            raise RuntimeError(f"client turn {self._open_turn} is still open; turns never overlap")
        if any(job.active for job in self.jobs.values()):
            raise RuntimeError("a typed job is active; hold microphone turns until it finishes")
        self._last_client_turn_id = self._open_turn = client_turn_id
        ack = await self._send_barrier("turn_start", client_turn_id)
        return ack["turn_id"]

    async def commit(self, client_turn_id: int) -> str:
        """``commit`` and its ``committed`` ack; returns the committed ``turn_id``."""
        if client_turn_id != self._open_turn:
            raise RuntimeError(f"client turn {client_turn_id} is not the open turn ({self._open_turn})")
        ack = await self._send_barrier("commit", client_turn_id)
        self._open_turn = None
        return ack["turn_id"]

    async def send_audio(self, pcm16: bytes, *, paced: bool) -> None:
        """Stream 16 kHz mono PCM16 as 80 ms appends; ``paced`` sends them on a real-time absolute schedule."""
        if len(pcm16) % 2:
            raise ValueError("PCM16 audio must have an even byte count")
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i, offset in enumerate(range(0, len(pcm16), APPEND_BYTES)):
            if paced:
                delay = start + i * APPEND_SECONDS - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            chunk = pcm16[offset : offset + APPEND_BYTES]
            await self._send(
                {
                    "type": "input_audio_buffer.append",
                    "event_id": new_event_id(),
                    "encoding": "pcm16",
                    "sample_rate": INPUT_SAMPLE_RATE,
                    "channels": 1,
                    "audio": base64.b64encode(chunk).decode("ascii"),
                }
            )

    async def request_typed(self, job_id: str, text: str, timeout: float = 15.0) -> TypedJob:
        """``input_text.request``; returns the job once it was accepted or rejected (see ``accepted``)."""
        if job_id in self.jobs:
            raise ValueError(f"job_id {job_id!r} was already used in this session")
        job = self.jobs[job_id] = TypedJob(job_id, text)
        await self._send({"type": "input_text.request", "event_id": new_event_id(), "job_id": job_id, "text": text})
        await self._until(lambda: job if job.accepted is not None else None, timeout, f"answer to typed job {job_id}")
        return job

    async def send_tool_result(
        self, call_id: str, output: str, model_output: str | None = None, timeout: float = 30.0
    ) -> Event:
        """``conversation.item.create``; returns ``…function_call_output.applied`` (or ``function_call.failed``).

        A rejection is raised as a recoverable :class:`ServerError`; the call stays pending server-side.
        """
        item: dict[str, Any] = {"type": "function_call_output", "call_id": call_id, "output": output}
        if model_output is not None:
            item["model_output"] = model_output
        event_id = new_event_id()
        since = len(self.events)
        await self._send({"type": "conversation.item.create", "event_id": event_id, "item": item})
        reply = await self.wait_for(
            lambda e: (
                e["type"] in ("conversation.item.function_call_output.applied", "response.function_call.failed")
                and e.get("call_id") == call_id
            )
            or self._echoes_error(e, event_id),
            timeout,
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

    @property
    def current_response(self) -> Response | None:
        """The open response, if any."""
        return self._current

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

    async def _send(self, event: Event) -> None:
        if self.failure is not None:
            raise self.failure
        if self._finished or self.closed_event is not None:
            raise SessionEnded("the session has ended")
        try:
            await self._ws.send(json.dumps(event, separators=(",", ":")))
        except ConnectionClosed as closed:
            if self._receiver is not None:  # let the receiver give its verdict (a fatal error, a violation)
                await asyncio.wait({self._receiver}, timeout=5)
            raise self.failure or SessionEnded(f"the socket closed: {closed}") from None

    async def _send_barrier(self, kind: str, client_turn_id: int) -> Event:
        if self._barrier is not None:
            raise RuntimeError(f"a {self._barrier.kind} barrier is still waiting for its ack")
        barrier = self._barrier = _Barrier(kind, client_turn_id, new_event_id())
        try:
            await self._send(
                {"type": f"input_audio_buffer.{kind}", "event_id": barrier.event_id, "client_turn_id": client_turn_id}
            )
            # The 15 s ack deadline is armed once the barrier has been written.
            what = f"{barrier.ack_type} for client turn {client_turn_id}"
            return await self._until(lambda: barrier.ack, BARRIER_ACK_TIMEOUT, what, fatal=True)
        finally:
            self._barrier = None

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
            barrier = self._barrier
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
        barrier = self._barrier
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

    def _on_call_terminal(self, e: Event) -> None:
        _require(e.get("call_id") == self._open_call, f"{e['type']}: call_id is not the open call's")
        self._open_call = None

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
