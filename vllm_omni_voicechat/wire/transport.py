"""What a wire protocol object hands its transport: event texts and the close instruction."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from .limits import too_many_containers

_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode  # built once: it runs per event
try:
    from orjson import JSONDecodeError as _OrjsonDecodeError
    from orjson import dumps as _orjson_dumps
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover - a dependency; the json path gives the same text and values
    _orjson_dumps = _orjson_loads = None
    _OrjsonDecodeError = ValueError

_FLAT = frozenset({str, int, bool, type(None)})
"""The types of the values orjson decodes exactly as the json module does: it reads an integer beyond 64 bits as a
float, and a float may be one. (orjson makes these exact types, never subclasses: a set lookup, not isinstance.)"""


def client_json(text: str, decode: Callable[[str], Any] = json.loads) -> Any:
    """A client frame's JSON value, exactly as ``decode`` (a json-module decoder) gives it, raising what it raises.
    An object of strings, 64-bit integers, booleans and nulls (an audio append: every frame of a session) is
    orjson's, ~3x faster (~3 us a 3.5 KB append); anything else, and anything orjson refuses, is ``decode``'s, so
    its values (big integers, NaN, lone surrogates) and its error messages are unchanged."""
    if _orjson_loads is not None:
        try:
            value = _orjson_loads(text)
        except _OrjsonDecodeError:
            return decode(text)
        if type(value) is dict:
            for item in value.values():
                if type(item) not in _FLAT:
                    return decode(text)
            return value
    return decode(text)


def server_json(event: dict[str, Any]) -> str:
    """:func:`compact_json` for an event made only of the server's own values (the per-position metrics, audio and
    text deltas): orjson, ~10x faster (two such events a position: ~11 µs of the ~50 µs the v3 server spends on
    one). Not for anything that echoes a client's value: orjson writes a NaN the client sent as null, where the
    json path echoes it as sent. What orjson refuses goes the json way."""
    if _orjson_dumps is not None:
        try:
            return _orjson_dumps(event).decode()
        except TypeError:  # orjson.JSONEncodeError
            pass
    return compact_json(event)


def compact_json(event: dict[str, Any]) -> str:
    """An event as sent and sized: compact JSON, UTF-8 kept (one serialisation for both dialects)."""
    text = _ENCODE(event)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate echoed from a client's JSON escape: keep it escaped
            text = json.dumps(event, separators=(",", ":"))
    return text


class WireText(NamedTuple):
    """One server event as JSON text; ``seq`` is its ``server_event_seq`` (tiered journaled events only). A named
    tuple: one is made per event sent, and a tuple is the cheapest immutable record."""

    text: str
    seq: int | None = None

    def json(self) -> dict:
        return json.loads(self.text)


MAX_CLOSE_REASON_BYTES = 123  # RFC 6455 §5.5: a control frame's payload is at most 125 bytes, 2 are the code


def close_reason(reason: str) -> str:
    """``reason`` cut to the 123 UTF-8 bytes a close frame carries, never inside a character."""
    data = reason.encode("utf-8", "replace")  # a lone surrogate cannot be sent: it becomes "?"
    return data[:MAX_CLOSE_REASON_BYTES].decode("utf-8", "ignore")


@dataclass(frozen=True, slots=True)
class CloseTransport:
    """Close the connection with this WebSocket close code, after everything before it was sent."""

    code: int
    reason: str = ""
    label: str = ""
    """The reason in the server's own vocabulary, for counters and logs, where the reason carries a client's words
    (its ``session.close`` reason, echoed): those never become a label. Empty: the reason is the server's."""


MAX_ECHOED_ID_CHARS = 256
"""An event id longer than this is never echoed (every error echoes one): the tiered dialect refuses the event,
v3 answers without it, and a refused frame's refusal carries none."""


def refused_event_id(message: str | bytes) -> Any:
    """The ``event_id`` of a JSON client event (both dialects name it so), or None: what a refusal echoes of a frame
    the host's full inbox did not take."""
    if not isinstance(message, str) or too_many_containers(message):
        return None  # a frame refused for the room it takes must not cost a decode of any size
    try:
        event = json.loads(message)
    except (ValueError, RecursionError):
        return None
    value = event.get("event_id") if isinstance(event, dict) else None
    if isinstance(value, str) and 0 < len(value) <= MAX_ECHOED_ID_CHARS:
        return value
    return None
