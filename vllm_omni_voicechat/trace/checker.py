"""The trace invariant checker (pure: no I/O, no clock): one instance watches one socket stream.

Feed it, in order, what the client sent (``client_event``), what the server sent (``server_event``) and how the
transport ended (``transport_closed``); it records every broken server guarantee in ``violations``. The rules
(docs/reliability.md, "Trace invariants"):

R1  responses: exactly one ``response.done`` per ``response.created``; never two open responses; a response id is
    never reused; response-scoped events (deltas, ``….done``, calls) name the open response.
R2  v3: a microphone turn's ``committed`` (and its ``speech_stopped`` / transcription ``completed``) precede the
    ``response.created`` carrying its ``turn_id``; barrier acks echo a barrier the client sent (same type, same
    ``client_turn_id``, ``client_event_id`` = that barrier's ``event_id``).
R3  superseded epochs: nothing of a response follows its terminal; tiered epochs never go backwards.
R4  tiered ``server_event_seq``: strictly +1 per stream. A fresh socket starts at 1; a resumed socket (first client
    event ``session.resume``) starts at the client's ``last_received_server_event_seq`` + 1; events without a seq
    (``session.created``/``resumed``/``replaced``/``resync_required``, handshake errors) are transport-level.
    ``stream="session"`` checks the client's de-duplicated view across sockets: +1 across resumes too.
R5  rejections: a client event that is invalid on its face (bad frame, JSON, type, append fields, base64, item,
    session object, barrier shape) is answered with its typed error echoing its event id; v3
    ``input_text.request`` with exactly one ``accepted``/``rejected`` for its ``job_id``. The server answers in
    order, so an answer to a later event proves the earlier ones were due; ``settled()`` (sync drivers) says all
    events so far were processed. An error never echoes an id the client did not send.
R6  endings: after a fatal error only ``session.closed`` (v3: for the codes the contract lists; the position limit
    may also close brackets) and then the contract's close code; nothing after ``session.closed`` /
    ``session.expired`` / ``session.replaced`` or the close; a server close needs a terminal event first; a server
    close leaves no response open.
R7  tiered admission queue: ``session.queued`` (position >= 1), then ``session.queue_update`` with smaller positions,
    then ``session.queue_done`` (position 0), all before ``session.created`` and never after the session began.
"""

from __future__ import annotations

import functools
import json
from collections import deque
from typing import Any, Literal

from ..errors import VoicechatError
from ..wire.tiered.session_events import QUEUE_EVENTS
from .rejections import (
    BINARY,
    INVALID,
    MAX_JSON_CONTAINERS,
    TOO_COMPLEX,
    Owed,
    echo_key,
    expected_text,
    is_int,
    predict_tiered,
    predict_v3,
)

Dialect = Literal["v3", "tiered", "tiered-openai"]

# v3 close codes per fatal code (contract §11); every other fatal code closes 1011.
_V3_CLOSE = {
    "session_position_limit": 1000,
    "session_configure_timeout": 1000,
    "session_idle_timeout": 1000,
    "server_busy": 1013,
    "unsupported_protocol_version": 1002,
    "invalid_event_id": 1002,
    "invalid_client_turn_id": 1002,
    "input_turn_conflict": 1002,
    "deferred_input_overflow": 1002,
}
# v3 fatal paths that send session.closed after the error (contract §15.21).
_V3_CLOSED_AFTER_FATAL = frozenset(
    {"function_call_loop_limit", "internal_error", "unsupported_protocol_version", "session_position_limit",
     "session_configure_timeout", "session_idle_timeout"}
)
_PROTOCOL_VIOLATIONS = frozenset(
    {"unsupported_protocol_version", "invalid_event_id", "invalid_client_turn_id", "input_turn_conflict",
     "deferred_input_overflow"}
)

# Response-scoped server events: they name a response that must be open.
_V3_RESPONSE_SCOPED = frozenset(
    {"response.output_text.delta", "response.output_audio.delta", "response.function_call_arguments.done",
     "response.function_call.failed", "response.output_text.done", "response.output_audio.done"}
)
_TIERED_NOT_SCOPED = frozenset({"response.created", "response.done", "response.listen"})


# Refused before the session saw the event (a full inbox): a valid answer to any event, sent out of order.
_REFUSALS = frozenset({"input_backpressure"})


def _closer(type_: str) -> bool:
    """Events that close brackets (allowed after the position-limit fatal, which closes them after the error)."""
    return (type_.endswith((".done", ".completed", ".speech_stopped", ".committed"))
            or type_ in ("rate_limits.updated", "conversation.item.added", "conversation.item.created",
                         "input_text.injection_finished"))


class TraceViolation(VoicechatError, AssertionError):
    pass


def _guarded(method):
    """A checker bug must never break the server it taps: it becomes a reported violation instead."""

    @functools.wraps(method)
    def wrapper(self, *args):
        try:
            return method(self, *args)
        except Exception as exc:  # noqa: BLE001 - reported, not raised, by design
            self._fail(f"checker error in {method.__name__}: {type(exc).__name__}: {exc}")
            return None

    return wrapper


class TraceChecker:
    """Checks one socket stream (``stream="socket"``) or a client's de-duplicated session view (``"session"``)."""

    def __init__(self, dialect: Dialect = "v3", *, stream: Literal["socket", "session"] = "socket",
                 lane: Literal["full", "openai"] = "full", name: str = "", history: int = 40) -> None:
        if dialect == "tiered-openai":
            dialect, lane = "tiered", "openai"
        if dialect not in ("v3", "tiered"):
            raise ValueError(f"unknown dialect {dialect!r}")
        self.dialect = dialect
        self.lane = lane
        self.stream = stream
        self.name = name
        self._violations: list[str] = []
        self._log: deque[str] = deque(maxlen=history)  # the recent frames, for the listing
        self.client_count = 0
        self.server_count = 0
        self.close_code: int | None = None
        self.transport_done = False
        self._finished = False
        # responses
        self._open: str | None = None
        self._done: set[str] = set()
        self._created: set[str] = set()
        # v3 turns
        self._mic_turns: set[str] = set()
        self._committed: set[str] = set()
        self._stopped: set[str] = set()
        self._completed: set[str] = set()
        self._barriers: dict[tuple[str, str, int], int] = {}  # (ack type, event id key, turn) -> unacked count
        # rejections
        self._owed: list[Owed] = []
        self._sent_ids: dict[str, int] = {}  # echo key -> index of the first client event carrying it
        self._job_ids: set[str] = set()
        self._stops: list[int] = []  # indexes of session.stop / session.close
        # endings
        self._greeted = False
        self._greeted_session = False
        self._queue_position: int | None = None  # the admission queue's last position told (0: admitted)
        self._terminal: str | None = None  # why no further event may come
        self._fatal: str | None = None  # the fatal code, once seen
        self._closed_after_fatal = False
        self._expected_close: frozenset[int] | None = None
        self._replaced = False
        # tiered
        self._resumed = False
        self._next_seq: int | None = 1
        self._epoch: int | None = None
        self._event_ids: set[str] = set()
        self._session_id: Any = None

    # ================================================================ public interface

    @property
    def violations(self) -> list[str]:
        return list(self._violations)

    def check(self) -> None:
        """End the trace (if not ended by a close) and raise listing every violation."""
        self.finish()
        if self._violations:
            head = f"trace {self.name or self.dialect}: {len(self._violations)} invariant violation(s)"
            tail = ["recent frames (C: client, S: server):", *self._log]
            raise TraceViolation("\n  ".join([head, *self._violations[:50], *tail]))

    def finish(self) -> None:
        """End-of-trace rules (idempotent; run by a server close too)."""
        if self._finished:
            return
        self._finished = True
        if self.close_code is not None and self._open is not None and not self._replaced:
            self._fail(f"response {self._open} never reached response.done before the server closed")

    def settled(self) -> None:
        """Every client event so far has been fully processed (a synchronous driver drained the session)."""
        for owed in self._owed:
            if not owed.answered:
                owed.answered = True
                self._fail(f"client event #{owed.index} ({owed.type}) was never answered "
                           f"({expected_text(owed)})")

    def skip_to(self, seq: int) -> None:
        """The client deliberately skipped ahead (resumed from a cursor beyond what it received): the next
        ``server_event_seq`` is ``seq``."""
        self._next_seq = seq
        self._resumed = True  # what it skipped may have opened a response

    @_guarded
    def client_event(self, message: str | bytes | dict) -> None:
        index = self.client_count
        self.client_count += 1
        obj: Any
        if isinstance(message, (bytes, bytearray, memoryview)):
            obj, raw = BINARY, bytes(message)
        elif isinstance(message, dict):
            obj, raw = message, None
        else:
            raw = message
            if len(message) > MAX_JSON_CONTAINERS and message.count("{") + message.count("[") > MAX_JSON_CONTAINERS:
                obj = TOO_COMPLEX  # refused undecoded (not decoded here either: a bomb would stall the test)
            else:
                try:
                    obj = (json.loads(message, parse_constant=_no_constant) if self.dialect == "tiered"
                           else json.loads(message))
                except (ValueError, RecursionError):
                    obj = INVALID
        if self.dialect == "tiered" and index == 0 and isinstance(obj, dict) and obj.get("type") == "session.resume":
            cursor = obj.get("last_received_server_event_seq", 0)
            self._resumed = True
            if self.stream == "socket":
                self._next_seq = (cursor + 1) if is_int(cursor) and cursor >= 0 else None
        self._log.append(f"C#{index} {_describe(obj, raw)}")
        if isinstance(obj, dict):
            eid = obj.get("event_id")
            if eid is not None:
                self._sent_ids.setdefault(echo_key(eid), index)
            if "job_id" in obj:
                self._job_ids.add(echo_key(obj.get("job_id")))
        if self._terminal is not None or self._fatal is not None or self.transport_done:
            return  # the session is over: nothing is owed
        if self.dialect == "v3":
            owed = predict_v3(index, obj, self._barriers, self._stops)
        else:
            owed = predict_tiered(index, obj, raw, self._stops)
        if owed is not None:
            if len(self._owed) >= 256:  # keep the scans short on long traces: answered entries are inert
                self._owed = [o for o in self._owed if not o.answered]
            self._owed.append(owed)

    @_guarded
    def server_event(self, message: str | bytes | dict) -> None:
        index = self.server_count
        self.server_count += 1
        if self.transport_done and self.close_code is None:
            return  # the peer left first: the server may not know yet
        if isinstance(message, (bytes, bytearray, memoryview)):
            self._fail(f"#{index}: the server sent a binary frame")
            return
        if isinstance(message, dict):
            event = message
        else:
            try:
                event = json.loads(message)
            except ValueError:
                self._fail(f"#{index}: the server sent a non-JSON text frame")
                return
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            self._fail(f"#{index}: a server event must be an object with a string type")
            return
        type_ = event["type"]
        where = f"#{index} {type_}"
        self._log.append(f"S{where}{_detail(event)}")
        if self.transport_done:
            self._fail(f"{where}: sent after the transport closed")
            return
        if self._terminal is not None:
            self._fail(f"{where}: sent after {self._terminal}")
            return
        if self._fatal is not None:
            self._after_fatal(where, type_, event)
            return
        self._envelope(where, index, type_, event)
        if self.dialect == "tiered":
            self._tiered_stream(where, type_, event)
        handler = (_V3_HANDLERS if self.dialect == "v3" else _TIERED_HANDLERS).get(type_)
        if handler is not None:
            handler(self, where, event)
        else:
            self._scoped(where, type_, event)

    @_guarded
    def transport_closed(self, code: int | None) -> None:
        """The socket ended: ``code`` is the close code the server sent, None when the peer went away first."""
        if self.transport_done:
            return
        self.transport_done = True
        self.close_code = code
        self._log.append(f"closed {code}")
        if code is not None:
            if self._expected_close is None and self.lane == "openai" and code == 1000:
                pass  # GA has no session.closed: a close or an expiry ends the socket silently
            elif self._expected_close is None:
                self._fail(f"the server closed ({code}) without a terminal event (session.closed, a fatal error, "
                           "a handshake refusal)")
            elif code not in self._expected_close:
                want = "/".join(str(c) for c in sorted(self._expected_close))
                self._fail(f"close code {code} after {self._terminal or self._fatal}; the contract says {want}")
        self.finish()

    # ================================================================ order of answers (rule R5)

    def _proof(self, index: int, where: str) -> None:
        """The server answered client event ``index``: every earlier non-deferrable owed answer is overdue."""
        for owed in self._owed:
            if owed.index >= index:
                break
            if not owed.answered and not owed.deferrable:
                owed.answered = True
                self._fail(f"{where}: client event #{owed.index} ({owed.type}) was not answered before this answer "
                           f"to #{index} (owed {expected_text(owed)})")

    # ================================================================ server events

    def _fail(self, text: str) -> None:
        self._violations.append(text)

    def _envelope(self, where: str, index: int, type_: str, event: dict) -> None:
        if self.dialect == "tiered" and type_ in QUEUE_EVENTS:
            if self._greeted_session or self._resumed:
                self._fail(f"{where}: {type_} after the session began")
            elif self.stream == "socket":
                self._queue(where, type_, event)
        elif self.dialect == "tiered" and self.stream == "socket" and not self._greeted_session and not self._resumed:
            if type_ in ("session.created", "session.resumed"):
                self._greeted_session = True
                if self._queue_position not in (None, 0):
                    self._fail(f"{where}: session.created while queued (no session.queue_done)")
            elif self._greeted and type_ not in ("error", "session.resync_required"):
                self._fail(f"{where}: sent before session.created")
        if not self._greeted:
            self._greeted = True
            first_ok = type_ in ("session.created", "error") or (
                self.dialect == "tiered" and type_ in ("session.resumed", "session.resync_required", *QUEUE_EVENTS))
            if self.dialect == "tiered" and self.stream == "session":
                first_ok = True
            if not first_ok:
                self._fail(f"{where}: the first server event must be session.created (or a refusal)")
            elif type_ == "error" and self.dialect == "v3":
                code = (event.get("error") or {}).get("code") if isinstance(event.get("error"), dict) else None
                if code != "server_busy":
                    self._fail(f"{where}: only the busy refusal may precede session.created, not {code!r}")
        eid = event.get("event_id")
        if isinstance(eid, str):
            if eid in self._event_ids:
                self._fail(f"{where}: duplicate server event_id {eid!r}")
            self._event_ids.add(eid)
        elif self.dialect == "v3":
            self._fail(f"{where}: no string event_id")
        if self.dialect == "v3":
            sid = event.get("session_id")
            if self._session_id is None:
                self._session_id = sid
            elif sid != self._session_id:
                self._fail(f"{where}: session_id {sid!r} differs from {self._session_id!r}")

    def _queue(self, where: str, type_: str, event: dict) -> None:
        """The admission queue: queued first, then updates with a smaller position, then done (position 0)."""
        position = event.get("position")
        if not is_int(position) or position < 0:
            self._fail(f"{where}: {type_} without a position")
            return
        if type_ == "session.queued":
            if self._queue_position is not None or position < 1:
                self._fail(f"{where}: session.queued twice or at position {position}")
        elif self._queue_position in (None, 0):
            self._fail(f"{where}: {type_} without session.queued before it")
        elif type_ == "session.queue_update" and not 1 <= position < self._queue_position:
            self._fail(f"{where}: queue position {self._queue_position} -> {position} (must move up)")
        elif type_ == "session.queue_done" and position != 0:
            self._fail(f"{where}: session.queue_done at position {position}")
        self._queue_position = position

    def _tiered_stream(self, where: str, type_: str, event: dict) -> None:
        seq = event.get("server_event_seq")
        if seq is not None:
            if not is_int(seq):
                self._fail(f"{where}: server_event_seq {seq!r} is not an integer")
            elif self._next_seq is None:
                self._next_seq = seq + 1
            elif seq != self._next_seq:
                self._fail(f"{where}: server_event_seq {seq}, expected {self._next_seq}")
                self._next_seq = seq + 1
            else:
                self._next_seq = seq + 1
        epoch = _epoch_of(event)
        if epoch is not None:
            if self._epoch is not None and epoch < self._epoch:
                self._fail(f"{where}: epoch {epoch} after epoch {self._epoch} (a superseded epoch)")
            else:
                self._epoch = epoch

    def _response_id(self, event: dict) -> Any:
        rid = event.get("response_id")
        if rid is None and isinstance(event.get("response"), dict):
            rid = event["response"].get("id")
        return rid

    def _on_created(self, where: str, event: dict) -> None:
        rid = self._response_id(event)
        if not isinstance(rid, str) or not rid:
            self._fail(f"{where}: no string response_id")
            return
        if self._open is not None:
            self._fail(f"{where}: {rid} created while {self._open} is still open")
        if rid in self._created or rid in self._done:
            self._fail(f"{where}: response id {rid} reused")
        if self.dialect == "v3":
            turn = event.get("turn_id")
            if turn in self._mic_turns:
                for seen, what in ((self._committed, "input_audio_buffer.committed"),
                                   (self._stopped, "input_audio_buffer.speech_stopped"),
                                   (self._completed, "transcription completed")):
                    if turn not in seen:
                        self._fail(f"{where}: {rid} created before {what} of its turn {turn}")
        self._created.add(rid)
        self._open = rid

    def _on_done(self, where: str, event: dict) -> None:
        rid = self._response_id(event)
        if rid in self._done:
            self._fail(f"{where}: a second response.done for {rid}")
        elif rid != self._open and not (self._resumed and rid not in self._created):
            self._fail(f"{where}: response.done for {rid}, which is not open")
        if rid == self._open:
            self._open = None
        if isinstance(rid, str):
            self._done.add(rid)

    def _scoped(self, where: str, type_: str, event: dict) -> None:
        if self.dialect == "v3":
            if type_ not in _V3_RESPONSE_SCOPED:
                return
        elif not type_.startswith("response.") or type_ in _TIERED_NOT_SCOPED:
            return
        rid = self._response_id(event)
        if rid is None:
            return
        if rid in self._done:
            self._fail(f"{where}: event of response {rid} after its terminal (superseded)")
        elif rid != self._open and not (self._resumed and rid not in self._created):
            self._fail(f"{where}: event of response {rid}, which is not open (open: {self._open})")

    def _on_barrier_ack(self, where: str, event: dict) -> None:
        type_ = event["type"]
        cid = event.get("client_event_id")
        turn_no = event.get("client_turn_id")
        slot = (type_, echo_key(cid), turn_no if is_int(turn_no) else -1)
        if self._barriers.get(slot, 0) < 1:
            self._fail(f"{where}: acks client_event_id {cid!r} / client_turn_id {turn_no!r}, which no unacknowledged "
                       "client barrier of that type carried (one ack per barrier)")
        else:
            self._barriers[slot] -= 1
        turn = event.get("turn_id")
        if not isinstance(turn, str) or not turn:
            self._fail(f"{where}: no turn_id")
        elif type_.endswith("turn_started"):
            self._mic_turns.add(turn)
        else:
            self._committed.add(turn)
        self._prove_id(where, cid)

    def _on_speech_stopped(self, where: str, event: dict) -> None:
        self._stopped.add(event.get("turn_id"))  # type: ignore[arg-type]

    def _on_transcript_completed(self, where: str, event: dict) -> None:
        self._completed.add(event.get("turn_id"))  # type: ignore[arg-type]

    def _on_typed_answer(self, where: str, event: dict) -> None:
        job = echo_key(event.get("job_id"))
        for owed in self._owed:
            if owed.job == job and not owed.answered:
                owed.answered = True
                self._proof(owed.index, where)
                return
        self._fail(f"{where}: answers job_id {event.get('job_id')!r}, which has no unanswered input_text.request")

    def _answered_echo(self, where: str, echo: Any, code: str | None) -> bool:
        """Match an answer echoing ``echo`` (an error's ``code``) to the oldest owed event it answers."""
        key = echo_key(echo)
        refused = code in _REFUSALS
        for owed in self._owed:
            if owed.answered or (owed.job is not None and not refused):
                continue
            if (owed.echo is None) != (echo is None) or (echo is not None and echo_key(owed.echo) != key):
                continue
            if code is not None and code not in owed.codes and not refused:
                continue
            owed.answered = True
            # An inbox refusal overtakes queued events, and an answer without an echo may belong to an event no
            # prediction covered: neither proves anything about order.
            if not refused and echo is not None:
                self._proof(owed.index, where)
            return True
        return False

    def _prove_id(self, where: str, echo: Any) -> None:
        """An answer echoing ``echo``: the first client event that carried it was processed (ids may repeat)."""
        index = self._sent_ids.get(echo_key(echo)) if echo is not None else None
        if index is not None:
            self._proof(index, where)

    def _on_error(self, where: str, event: dict) -> None:
        body = event.get("error")
        if not isinstance(body, dict):
            if self.dialect == "tiered":
                self._handshake_end(where, "a flat handshake error", frozenset({1000}))
                return
            self._fail(f"{where}: error body is not an object")
            return
        code = body.get("code")
        if self.dialect == "v3":
            fatal = body.get("fatal")
            if not isinstance(fatal, bool):
                self._fail(f"{where}: error.fatal is not a boolean")
            echo = body.get("client_event_id")
        else:
            fatal = body.get("retryable") is False
            echo = body.get("event_id")
        if (echo is not None and echo_key(echo) not in self._sent_ids and echo_key(echo) not in self._job_ids
                and not self._resumed):  # a resumed socket replays answers to events of earlier sockets
            self._fail(f"{where}: error {code} echoes {echo!r}, which the client never sent")
        matched = self._answered_echo(where, echo, code)
        if not matched and code not in _REFUSALS:
            self._prove_id(where, echo)
        if not matched and echo is not None:
            for owed in self._owed:  # the right event, the wrong code
                if not owed.answered and owed.echo is not None and echo_key(owed.echo) == echo_key(echo) and owed.codes:
                    if self._sent_ids.get(echo_key(echo)) != owed.index:
                        break  # an earlier event carried the same id: the error may be that event's answer
                    owed.answered = True
                    self._fail(f"{where}: client event #{owed.index} ({owed.type}) answered with {code}, "
                               f"expected {'|'.join(sorted(owed.codes))}")
                    break
        if self.dialect == "tiered" and event.get("server_event_seq") is None and self.stream == "socket":
            # transport-level (no seq): a handshake or resume refusal, answered and closed
            expected = frozenset({1013}) if code == "resource_exhausted" else frozenset({1000})
            self._handshake_end(where, f"handshake error {code}", expected)
            return
        if fatal:
            self._fatal = str(code)
            if self.dialect == "v3":
                self._expected_close = frozenset({_V3_CLOSE.get(code, 1011)})  # type: ignore[arg-type]
            elif code == "session_position_limit":
                self._expected_close = frozenset({1000})
            elif code in _PROTOCOL_VIOLATIONS:
                self._expected_close = frozenset({1002, 1011})
            else:
                self._expected_close = frozenset({1011})
            if self._open is not None and code != "session_position_limit":
                self._fail(f"{where}: fatal {code} while response {self._open} is open (its terminal comes first)")

    def _handshake_end(self, where: str, what: str, expected: frozenset[int]) -> None:
        self._terminal = what
        self._expected_close = expected

    def _after_fatal(self, where: str, type_: str, event: dict) -> None:
        code = self._fatal
        if type_ == "session.closed" and not self._closed_after_fatal:
            self._closed_after_fatal = True
            if self.dialect == "v3":
                if code not in _V3_CLOSED_AFTER_FATAL:
                    self._fail(f"{where}: session.closed after fatal {code} (the contract sends none)")
                if event.get("status") != "failed":
                    self._fail(f"{where}: session.closed after a fatal error must be status failed")
            elif event.get("reason") != code:
                self._fail(f"{where}: session.closed reason {event.get('reason')!r} after fatal {code}")
            self._terminal = f"session.closed after fatal {code}"
            return
        if code == "session_position_limit" and _closer(type_):
            if type_ == "response.done":
                self._on_done(where, event)
            return
        if (code == "session_position_limit" and self.dialect == "tiered" and self._open is not None
                and self._response_id(event) == self._open and type_.startswith("response.output_audio")):
            return  # the tiered terminal flushes the open response's resampler before its done events
        self._fail(f"{where}: sent after fatal error {code}")

    def _on_session_closed(self, where: str, event: dict) -> None:
        if self._open is not None:
            self._fail(f"{where}: session.closed while response {self._open} is open")
        status = event.get("status")
        reason = event.get("reason")
        if self.dialect == "v3":
            if status == "completed":
                self._expected_close = frozenset({1000})
            else:
                self._expected_close = frozenset({_V3_CLOSE.get(reason, 1011)})  # type: ignore[arg-type]
            if reason == "client_stop" and self._stops:
                self._proof(self._stops[0], where)
        else:
            self._expected_close = frozenset({1000})
            if self._stops:
                self._proof(self._stops[0], where)
        self._terminal = "session.closed"

    def _on_tiered_terminal(self, where: str, event: dict) -> None:
        type_ = event["type"]
        if type_ == "session.replaced":
            self._replaced = True
        elif self._open is not None:
            self._fail(f"{where}: {type_} while response {self._open} is open")
        self._terminal = type_
        self._expected_close = frozenset({1000})

    def _on_resync(self, where: str, event: dict) -> None:
        if self._resumed and self.stream == "socket" and self.server_count == 1:
            self._handshake_end(where, "a resume refused with session.resync_required", frozenset({1000}))


def _describe(obj: Any, raw: Any) -> str:
    if obj is BINARY:
        return f"<binary {len(raw)} B>"
    if obj is INVALID:
        return "<invalid json>"
    if obj is TOO_COMPLEX:
        return f"<too complex {len(raw)} chars>"
    if not isinstance(obj, dict):
        return f"<{type(obj).__name__}>"
    return f"{str(obj.get('type'))[:60]} id={str(obj.get('event_id'))[:40]}"


def _detail(event: dict) -> str:
    body = event.get("error")
    if isinstance(body, dict):
        echo = body.get("client_event_id", body.get("event_id"))
        return f" {body.get('code')} fatal={body.get('fatal', body.get('retryable'))} echo={str(echo)[:40]}"
    for key in ("response_id", "turn_id", "reason"):
        if key in event:
            return f" {key}={str(event[key])[:40]}"
    return ""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _epoch_of(event: dict) -> int | None:
    """The epoch a tiered event declares (top level, ``metadata`` or ``response.metadata``); GA renders strings."""
    for holder in (event, event.get("metadata"), (event.get("response") or {}).get("metadata")
                   if isinstance(event.get("response"), dict) else None):
        if isinstance(holder, dict) and "epoch" in holder:
            value = holder["epoch"]
            if is_int(value):
                return value
            if isinstance(value, str) and value.isdigit():
                return int(value)
    return None


_COMMON_HANDLERS = {
    "response.created": TraceChecker._on_created,
    "response.done": TraceChecker._on_done,
    "error": TraceChecker._on_error,
    "session.closed": TraceChecker._on_session_closed,
}
_V3_HANDLERS = {
    **_COMMON_HANDLERS,
    "input_audio_buffer.turn_started": TraceChecker._on_barrier_ack,
    "input_audio_buffer.committed": TraceChecker._on_barrier_ack,
    "input_audio_buffer.speech_stopped": TraceChecker._on_speech_stopped,
    "conversation.item.input_audio_transcription.completed": TraceChecker._on_transcript_completed,
    "input_text.accepted": TraceChecker._on_typed_answer,
    "input_text.rejected": TraceChecker._on_typed_answer,
}
_TIERED_HANDLERS = {
    **_COMMON_HANDLERS,
    "session.expired": TraceChecker._on_tiered_terminal,
    "session.replaced": TraceChecker._on_tiered_terminal,
    "session.resync_required": TraceChecker._on_resync,
}
