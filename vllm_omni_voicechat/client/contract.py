"""The v3 client as a sans-I/O state machine: every check the contract lets a client make on the server's events
(the greeting, unique event ids, barrier acks in order, cumulative deltas, one open response and one open function
call at a time, terminals), the client's own turn, job, response and call records, and the barrier-ack deadlines
(armed when a barrier is written, paused while a function epoch is open). Time is injected.

The asyncio client (``v3.py``) hands it every received event (:meth:`V3ClientProtocol.receive`, which raises the
first :class:`ProtocolError` or fatal :class:`ServerError`) and runs the effects it returns; the outbound arbiter
(``arbiter.py``) it owns orders what goes out.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..audio.frames import OUTPUT_SAMPLE_RATE
from ..errors import VoicechatError
from ..ids import SYSTEM_IDS, Ids

if TYPE_CHECKING:
    from .arbiter import OutboundArbiter

PROTOCOL = {"name": "voicechat.realtime", "version": 3}
INPUT_TURN_DETECTION = "client_smart_turn_v1"
MODEL_OUTPUT_MODE = "client_authored_v1"
BARRIER_ACK_TIMEOUT = 15.0
RESPONSE_STATUSES = frozenset({"completed", "cancelled", "failed"})
TYPED_DISPOSITIONS = frozenset({"completed", "cancelled", "replaced", "error"})
SOURCES = frozenset({"microphone", "typed"})

Event = dict[str, Any]


class V3ClientError(VoicechatError):
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
    task: Any = field(default=None, repr=False, compare=False)  # the shell's handler task

    @property
    def done(self) -> bool:
        return self.outcome is not None


@dataclass
class Barrier:
    """A written ``turn_start`` / ``commit`` and its acknowledgement."""

    kind: str  # "turn_start" or "commit"
    client_turn_id: int
    event_id: str
    ack: Event | None = None
    deadline: float | None = None
    """When its ack is due (None: not armed, or paused while a function epoch is open)."""

    @property
    def ack_type(self) -> str:
        return "input_audio_buffer.turn_started" if self.kind == "turn_start" else "input_audio_buffer.committed"


@dataclass(frozen=True)
class RunTool:
    """A call of a registered tool was published: run its handler."""

    run: ToolRun


@dataclass(frozen=True)
class StopTool:
    """The call ended (``function_call.failed``) before its handler answered: stop the handler."""

    run: ToolRun


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ProtocolError(message)


def _string(event: Event, key: str) -> str:
    value = event.get(key)
    _require(isinstance(value, str) and value != "", f"{event['type']}: {key} must be a non-empty string")
    return value


class V3ClientProtocol:
    def __init__(self, arbiter: OutboundArbiter, *, tool_names: Iterable[str] = (), ids: Ids = SYSTEM_IDS) -> None:
        self.arbiter = arbiter
        self.tool_names = set(tool_names)
        self.ids = ids
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
        self.closed_event: Event | None = None  # session.closed
        self.barriers: deque[Barrier] = deque()  # written barriers awaiting their acks, in order
        self.results_sent: set[str] = set()
        self._event_ids: set[str] = set()
        self._current: Response | None = None
        self._open_call: str | None = None
        self._open_turn: int | None = None
        self._last_client_turn_id = 0
        self._effects: list[RunTool | StopTool] = []

    # ================================================================ state

    @property
    def current_response(self) -> Response | None:
        """The open response, if any."""
        return self._current

    @property
    def function_epoch(self) -> str | None:
        """The ``call_id`` of the open function epoch, if any."""
        return self._open_call

    @property
    def open_turn(self) -> int | None:
        """The client turn started and not yet committed."""
        return self._open_turn

    # ================================================================ inputs

    @staticmethod
    def decode(message: str | bytes) -> Event:
        """One server frame as an event: a JSON object with a string ``type``."""
        if isinstance(message, bytes):
            raise ProtocolError("the server sent a binary frame")
        try:
            event = json.loads(message)
        except ValueError:
            raise ProtocolError(f"the server sent invalid JSON: {message[:80]!r}") from None
        _require(isinstance(event, dict) and isinstance(event.get("type"), str), "an event needs a string type")
        return event

    def receive(self, event: Event) -> list[RunTool | StopTool]:
        """Check one server event and record what it says; the effects for the shell. Raises the contract
        violation (:class:`ProtocolError`) or the fatal :class:`ServerError` that ends the session."""
        self._effects = []
        self._check(event)
        return self._effects

    def start_turn(self, client_turn_id: int) -> Barrier:
        """A ``turn_start`` barrier for a new client turn (turns never overlap; ids increase)."""
        if not isinstance(client_turn_id, int) or isinstance(client_turn_id, bool) or client_turn_id < 1:
            raise ValueError("client_turn_id must be an integer >= 1")
        if client_turn_id <= self._last_client_turn_id:
            raise ValueError(f"client_turn_id must increase (last was {self._last_client_turn_id})")
        if self._open_turn is not None:
            raise RuntimeError(f"client turn {self._open_turn} is still open; turns never overlap")
        self._last_client_turn_id = self._open_turn = client_turn_id
        return Barrier("turn_start", client_turn_id, self.new_event_id())

    def commit(self, client_turn_id: int) -> Barrier:
        """The ``commit`` barrier of the open client turn; the turn is closed for this client at once."""
        if client_turn_id != self._open_turn:
            raise RuntimeError(f"client turn {client_turn_id} is not the open turn ({self._open_turn})")
        self._open_turn = None
        return Barrier("commit", client_turn_id, self.new_event_id())

    def turn_dropped(self, client_turn_id: int | None) -> None:
        """The arbiter dropped a held turn: it is no longer open."""
        if self._open_turn == client_turn_id:
            self._open_turn = None

    def ack_deadline(self, barrier: Barrier, now: float) -> float | None:
        """When ``barrier``'s ack is due: 15 s after it was written, paused while a function epoch is open (the
        server defers the barrier until the epoch closes) and re-armed when it closes."""
        if self._open_call is not None:
            barrier.deadline = None
        elif barrier.deadline is None:
            barrier.deadline = now + BARRIER_ACK_TIMEOUT
        return barrier.deadline

    def configured(self, reply: Event, negotiated: bool) -> None:
        """Check the ``session.updated`` answering our one ``session.update`` and record the session."""
        body = reply.get("session")
        _require(isinstance(body, dict), "session.updated: session must be an object")
        _require(body.get("protocol_version") == 3, "session.updated: session.protocol_version must be 3")
        _require(body.get("id") == self.session_id, "session.updated: session.id changed")
        caps = body.get("capabilities") or {}
        mode = caps.get("function_output_model_output") if isinstance(caps, dict) else None
        expected = MODEL_OUTPUT_MODE if negotiated else None
        _require(mode == expected, f"session.updated: function_output_model_output is {mode!r}, expected {expected!r}")
        self.session = body
        self.model_output_mode = mode

    # ================================================================ client events

    def new_event_id(self) -> str:
        return f"client_evt_{self.ids.hex(16)}"

    @staticmethod
    def barrier_event(barrier: Barrier) -> Event:
        return {"type": f"input_audio_buffer.{barrier.kind}", "event_id": barrier.event_id,
                "client_turn_id": barrier.client_turn_id}

    # ================================================================ server events

    def _check(self, e: Event) -> None:
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
            barrier = self.barriers[0] if self.barriers else None
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
        barrier = self.barriers[0] if self.barriers else None
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
        self.barriers.popleft()
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
        run = self.tool_runs[call_id] = ToolRun(call_id, name, parsed, handled=name in self.tool_names)
        if run.handled:
            self._effects.append(RunTool(run))

    def _on_call_terminal(self, e: Event) -> None:
        call_id = e.get("call_id")
        _require(call_id == self._open_call, f"{e['type']}: call_id {call_id!r} is not the open call's")
        applied = e["type"] == "conversation.item.function_call_output.applied"
        _require(not applied or call_id in self.results_sent, f"applied for {call_id} before its result was sent")
        self._open_call = None
        self.arbiter.close_epoch(call_id)
        run = self.tool_runs[call_id]
        run.outcome, run.terminal = ("applied" if applied else "failed"), e
        if run.output is None and run.task is not None:
            self._effects.append(StopTool(run))  # the server gave up waiting: a late result would only be rejected

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


_HANDLERS: dict[str, Callable[[V3ClientProtocol, Event], None]] = {
    "session.created": V3ClientProtocol._on_created,
    "error": V3ClientProtocol._on_error,
    "session.closed": V3ClientProtocol._on_closed,
    "input_audio_buffer.speech_started": V3ClientProtocol._on_speech_started,
    "input_audio_buffer.turn_started": V3ClientProtocol._on_barrier_ack,
    "input_audio_buffer.committed": V3ClientProtocol._on_barrier_ack,
    "conversation.item.input_audio_transcription.delta": V3ClientProtocol._on_transcript_delta,
    "input_audio_buffer.speech_stopped": V3ClientProtocol._on_speech_stopped,
    "conversation.item.input_audio_transcription.completed": V3ClientProtocol._on_transcript_completed,
    "response.created": V3ClientProtocol._on_response_created,
    "response.output_text.delta": V3ClientProtocol._on_text_delta,
    "response.output_audio.delta": V3ClientProtocol._on_audio_delta,
    "response.output_text.done": V3ClientProtocol._on_text_done,
    "response.output_audio.done": V3ClientProtocol._on_audio_done,
    "response.done": V3ClientProtocol._on_response_done,
    "response.function_call_arguments.done": V3ClientProtocol._on_function_call,
    "conversation.item.function_call_output.applied": V3ClientProtocol._on_call_terminal,
    "response.function_call.failed": V3ClientProtocol._on_call_terminal,
    "input_text.accepted": V3ClientProtocol._on_typed_answer,
    "input_text.rejected": V3ClientProtocol._on_typed_answer,
    "input_text.injection_started": V3ClientProtocol._on_injection_started,
    "input_text.injection_finished": V3ClientProtocol._on_injection_finished,
}
