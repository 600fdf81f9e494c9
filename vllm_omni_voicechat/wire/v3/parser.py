"""Client → server events of the v3 dialect (pure; the contract's §3 and its error tables).

A frame is read in two steps because the contract orders some state checks before an event's shape:
``read(frame)`` gives the ``Envelope`` (a JSON object with a known ``type``) or the ``Refused`` for a frame that is
invalid on its face (binary, too many containers, JSON, not an object, unknown type); then the connection runs the
checks that come first for that type (``settings_locked`` before a ``session.update`` is read,
``session_not_configured`` before an append's audio is decoded, the model-owned mode before a barrier's shape) and
calls the type's parser, which gives one frozen event or the type's ``Refused``. Checks that come between two shape
checks (the negotiated capability's lock) read the event's typed fields. Nothing here raises or keeps state.
"""

from __future__ import annotations

import json
from typing import Any

from ...records import record
from ...session.tools import InvalidTools, normalize_tools
from ..limits import MAX_INSTRUCTIONS_CHARS, MAX_JSON_CONTAINERS, too_many_containers
from ..transport import MAX_ECHOED_ID_CHARS, client_json
from .audio import AudioRejected, decode_append
from .schema import MODEL_OUTPUT_MODE


class _Missing:
    """A field the client did not send (distinct from ``null``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


@record
class Refused:
    """The typed error a frame gets; ``fatal``: a protocol violation that ends the session."""

    code: str
    message: str
    event_id: Any = None
    details: dict | None = None
    fatal: bool = False


@record
class Envelope:
    type: str
    body: dict
    event_id: Any
    """The id an error may echo (``echoed_id``)."""


@record
class SessionUpdate:
    event_id: Any
    version: Any
    """``protocol_version`` as sent (``MISSING`` when absent)."""
    capabilities: Refused | None
    """The first problem of ``session.capabilities``, if any."""
    model_output_mode: Any
    """The requested ``function_output_model_output`` (None or the mode; ``MISSING`` without capabilities)."""
    instructions: Any
    """A string (other JSON values as their text), None to restore the default, ``MISSING`` to keep them."""
    tools: Any
    """The normalized tools, or ``MISSING`` to keep them (``null`` clears: an empty tuple)."""
    problem: Refused | None
    """The first problem after the capabilities (instructions too long, invalid tools)."""


@record
class Append:
    event_id: Any
    pcm: bytes


@record
class TurnStart:
    event_id: str
    client_turn_id: int


@record
class Commit:
    event_id: str
    client_turn_id: int


@record
class TypedRequest:
    event_id: Any
    job_id: Any
    text: Any
    """As sent: the core gives a typed request its rejection reason, in the contract's order."""


@record
class FunctionOutput:
    event_id: Any
    call_id: Any
    output: Any
    model_output: Any


@record
class Stop:
    event_id: Any


TYPES = frozenset({"session.update", "input_audio_buffer.append", "input_audio_buffer.turn_start",
                   "input_audio_buffer.commit", "input_text.request", "conversation.item.create", "session.stop"})


def echoed_id(body: dict) -> Any:
    """The client event id an error echoes; None for a string too long to echo (no amplification) or a value that
    is not an id."""
    value = body.get("event_id")
    if isinstance(value, str):
        return value if len(value) <= MAX_ECHOED_ID_CHARS else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read(message: str | bytes) -> Envelope | Refused:
    if isinstance(message, (bytes, bytearray)):
        return Refused("binary_audio_unsupported", "binary frames are not supported; send JSON text")
    if too_many_containers(message):
        return Refused("event_too_large", f"more than {MAX_JSON_CONTAINERS} JSON objects and arrays; event refused",
                       details={"max_json_containers": MAX_JSON_CONTAINERS})
    try:
        body = client_json(message)
    except (ValueError, RecursionError) as exc:  # RecursionError: hostile nesting depth
        return Refused("invalid_json", f"invalid JSON: {exc}")
    if not isinstance(body, dict):
        return Refused("invalid_event", "a client event must be a JSON object")
    type_ = body.get("type")
    if not isinstance(type_, str) or type_ not in TYPES:
        return Refused("unsupported_event", f"Unsupported event: {type_}", echoed_id(body))
    return Envelope(type_, body, echoed_id(body))


def session_update(env: Envelope) -> SessionUpdate | Refused:
    cid = env.event_id
    session = env.body.get("session", MISSING)
    if not isinstance(session, dict):
        return Refused("invalid_session_update", "session must be an object", cid)
    capabilities: Refused | None = None
    mode = MISSING
    caps = session.get("capabilities", MISSING)
    if caps is not MISSING:
        if not isinstance(caps, dict):
            capabilities = Refused("invalid_session_capabilities", "session.capabilities must be an object", cid)
        else:
            mode = caps.get("function_output_model_output")
            if mode not in (None, MODEL_OUTPUT_MODE):
                capabilities = Refused("unsupported_session_capability",
                                       f"function_output_model_output must be null or {MODEL_OUTPUT_MODE!r}", cid)
    problem: Refused | None = None
    instructions = session.get("instructions", MISSING)
    if instructions is not MISSING and instructions is not None and not isinstance(instructions, str):
        instructions = json.dumps(instructions) if isinstance(instructions, (dict, list)) else str(instructions)
    if isinstance(instructions, str) and len(instructions) > MAX_INSTRUCTIONS_CHARS:
        problem = Refused("invalid_session_update", f"instructions are at most {MAX_INSTRUCTIONS_CHARS} characters",
                          cid)
    tools: Any = session.get("tools", MISSING)
    if tools is not MISSING and problem is None:
        try:
            tools = normalize_tools([] if tools is None else tools)
        except InvalidTools as exc:
            problem = Refused("invalid_tools", str(exc), cid)
    return SessionUpdate(cid, session.get("protocol_version", MISSING), capabilities, mode, instructions,
                         tools if problem is None else MISSING, problem)


def append(env: Envelope) -> Append | Refused:
    try:
        return Append(env.event_id, decode_append(env.body))
    except AudioRejected as rejected:
        return Refused(rejected.code, rejected.message, env.event_id)


def barrier(env: Envelope) -> TurnStart | Commit | Refused:
    """A turn barrier; its shape errors are protocol violations (fatal)."""
    body = env.body
    event_id = body.get("event_id")
    if not isinstance(event_id, str) or not event_id:
        return Refused("invalid_event_id", "turn barriers require a non-empty string event_id", fatal=True)
    turn = body.get("client_turn_id")
    if not _is_int(turn) or turn < 1:
        return Refused("invalid_client_turn_id", f"client_turn_id must be an integer >= 1, not {turn!r}", event_id,
                       fatal=True)
    if env.type == "input_audio_buffer.turn_start":
        return TurnStart(event_id, turn)
    return Commit(event_id, turn)  # commit diagnostics are trace-only and never fail a turn


def typed_request(env: Envelope) -> TypedRequest:
    return TypedRequest(env.event_id, env.body.get("job_id"), env.body.get("text"))


def item_create(env: Envelope) -> FunctionOutput | Refused:
    item = env.body.get("item")
    if not isinstance(item, dict) or item.get("type") != "function_call_output":
        return Refused("invalid_conversation_item", "item must be a function_call_output object", env.event_id)
    return FunctionOutput(env.event_id, item.get("call_id"), item.get("output"), item.get("model_output"))


def stop(env: Envelope) -> Stop:
    return Stop(env.event_id)

