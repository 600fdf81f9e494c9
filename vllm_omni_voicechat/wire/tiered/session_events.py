"""The session-level server events of the tiered dialect (docs/tiered-dialect.md §1.3, §3.7, §6): pure builders,
without ``event_id`` / ``server_event_seq`` (the session stamps and journals them). The response lifecycle is the
projector's."""

from __future__ import annotations

from typing import Any

from ..limits import bounded_message
from ..transport import compact_json
from .parser import error_class

WireEvent = dict[str, Any]


def error_event(code: str, message: str, *, event_id: Any = None, param: str | None = None,
                retryable: bool | None = None) -> WireEvent:
    body: dict[str, Any] = {"type": error_class(code), "code": code, "message": bounded_message(message)}
    if event_id is not None:
        body["event_id"] = event_id
    if param is not None:
        body["param"] = param
    if retryable is not None:
        body["retryable"] = retryable
    return {"type": "error", "error": body}


def handshake_error(code: str, message: str, *, server_event_id: str, event_id: Any = None, param: str | None = None,
                    retryable: bool | None = None) -> str:
    """An error answered before (or instead of) a session: its JSON text, with the server's own ``event_id``."""
    body = error_event(code, message, event_id=event_id, param=param, retryable=retryable)
    return compact_json({"type": "error", "event_id": server_event_id, "error": body["error"]})


QUEUE_EVENTS = ("session.queued", "session.queue_update", "session.queue_done")
"""The admission queue's events (names as in the MiniCPM-o duplex server): sent before ``session.created`` to a
connection that waits for a slot, transport-level (no ``server_event_seq``, never journaled)."""


def queue_event(type_: str, *, server_event_id: str, position: int, estimated_wait_s: float | None) -> str:
    """``session.queued`` / ``session.queue_update`` (``position`` from 1) or ``session.queue_done`` (position 0);
    ``estimated_wait_s`` comes from observed session durations (None until one session has ended)."""
    if type_ not in QUEUE_EVENTS:
        raise ValueError(type_)
    wait = None if estimated_wait_s is None else round(estimated_wait_s, 1)
    return compact_json({"type": type_, "event_id": server_event_id, "position": position,
                         "estimated_wait_s": wait})


def session_event(type_: str, session: dict) -> WireEvent:
    """``session.created`` / ``session.updated`` around a rendered ``session`` object."""
    return {"type": type_, "session": session}


def session_created(session: dict, *, generation: int | None = None, resume_token: str | None = None) -> WireEvent:
    event = session_event("session.created", session)
    if resume_token is not None:
        event["attachment_generation"] = generation
        event["resume_token"] = resume_token
    return event


def session_resumed(session_id: str, session: dict, generation: int, resume_token: str,
                    input_received: dict | None = None) -> WireEvent:
    """``input_received`` (our extension, capability ``supports_input_receipt``): how much of the client's audio the
    session had taken in when the resume was answered, so that the client resends exactly the rest (§6.5)."""
    event = {"type": "session.resumed", "session_id": session_id, "session": session,
             "attachment_generation": generation, "resume_token": resume_token}
    if input_received is not None:
        event["input_received"] = input_received
    return event


def session_replaced(session_id: str, generation: int) -> WireEvent:
    return {"type": "session.replaced", "session_id": session_id, "attachment_generation": generation}


def resync_required(session_id: str, reason: str) -> WireEvent:
    return {"type": "session.resync_required", "session_id": session_id, "reason": reason}


def session_expired(session_id: str, reason: str) -> WireEvent:
    return {"type": "session.expired", "session_id": session_id, "reason": reason}


def session_closed(session_id: str, epoch: int, reason: str) -> WireEvent:
    return {"type": "session.closed", "session_id": session_id, "epoch": epoch, "reason": reason,
            "event": {"type": "session.closed", "reason": reason}}


def heartbeat_ack(session_id: str) -> WireEvent:
    return {"type": "session.heartbeat_ack", "session_id": session_id}


def turn_event(session_id: str, event: str, turn_state: str, epoch: int, **fields: Any) -> WireEvent:
    return {"type": "turn.event", "session_id": session_id, "event": event, **fields, "turn_state": turn_state,
            "epoch": epoch}


def input_cleared() -> WireEvent:
    return {"type": "input_audio_buffer.cleared"}


def item_retrieved(item: dict) -> WireEvent:
    return {"type": "conversation.item.retrieved", "item": item}


def item_deleted(item_id: str) -> WireEvent:
    return {"type": "conversation.item.deleted", "item_id": item_id}
