"""Rule R5 at receipt (pure): the answer a client event is owed when it is invalid on its face, or a typed
request's one ``accepted``/``rejected``; the checker matches what the server sends against these."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

MAX_V3_APPEND_BYTES = 40_960  # contract §4 rule 7
TIERED_MAX_FRAME_BYTES = 15 * 1024 * 1024
MAX_ECHOED_ID_CHARS = 256  # a longer event_id is not echoed (tiered: the event is refused as bad_event)
MAX_JSON_CONTAINERS = 10_000  # more opening brackets than this: refused undecoded as event_too_large

V3_CLIENT_TYPES = frozenset(
    {"session.update", "input_audio_buffer.append", "input_audio_buffer.turn_start", "input_audio_buffer.commit",
     "input_text.request", "conversation.item.create", "session.stop"}
)
TIERED_CLIENT_TYPES = frozenset(
    {"audio.playback_ack", "barge_in", "close", "close_session", "conversation.item.create",
     "conversation.item.delete", "conversation.item.retrieve", "conversation.item.truncate", "input.cancel",
     "input.commit", "input.text.append", "input_audio_buffer.append", "input_audio_buffer.clear",
     "input_audio_buffer.commit", "input_text.append", "output_audio_buffer.clear", "playback.ack", "push_text",
     "response.cancel", "response.create", "session.close", "session.event_ack", "session.heartbeat",
     "session.resume", "session.update", "signal_turn", "turn.signal"}
)
_TIERED_CLOSE_TYPES = frozenset({"session.close", "close", "close_session"})
_V3_APPEND_CODES = frozenset(
    {"unsupported_audio_encoding", "unsupported_sample_rate", "unsupported_channel_count", "empty_audio",
     "invalid_audio", "audio_packet_too_large"}
)

# A client frame that is not a JSON object's text.
INVALID = object()
BINARY = object()
TOO_COMPLEX = object()


def echo_key(value: Any) -> str:
    """A hashable, NaN-safe identity for an echoed id (ids may be any JSON value)."""
    try:
        return json.dumps(value, sort_keys=True, allow_nan=True)
    except (TypeError, ValueError):
        return repr(value)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(slots=True)
class Owed:
    index: int
    type: str
    codes: frozenset[str]
    """Acceptable error codes (empty: a typed answer is owed instead)."""
    echo: Any
    """The id the answer must echo (None: no echo)."""
    deferrable: bool = False
    """May be answered after later events (a v3 typed request waiting for the previous job)."""
    job: str | None = None
    answered: bool = False


def predict_v3(index: int, obj: Any, barriers: dict[tuple[str, str, int], int],
               stops: list[int]) -> Owed | None:
    """What a v3 client event is owed; counts the barrier acks it makes due (``barriers``) and notes a
    ``session.stop`` (``stops``)."""
    if obj is BINARY:
        return Owed(index, "<binary>", frozenset({"binary_audio_unsupported"}), None)
    if obj is TOO_COMPLEX:
        return Owed(index, "<too complex>", frozenset({"event_too_large"}), None)
    if obj is INVALID:
        return Owed(index, "<invalid json>", frozenset({"invalid_json"}), None)
    if not isinstance(obj, dict):
        return Owed(index, "<not an object>", frozenset({"invalid_event"}), None)
    type_ = obj.get("type")
    eid = obj.get("event_id")
    echo = eid if ((isinstance(eid, str) and len(eid) <= MAX_ECHOED_ID_CHARS) or is_int(eid)) else None
    name = type_ if isinstance(type_, str) else "<no type>"
    if not isinstance(type_, str) or type_ not in V3_CLIENT_TYPES:
        return Owed(index, name, frozenset({"unsupported_event"}), echo)
    if type_ == "input_audio_buffer.append":
        code = _v3_append_code(obj)
        return None if code is None else Owed(index, type_, frozenset({code, "session_not_configured"}), echo)
    if type_ in ("input_audio_buffer.turn_start", "input_audio_buffer.commit"):
        if not isinstance(eid, str) or not eid:
            return Owed(index, type_, frozenset({"invalid_event_id"}), None)
        turn = obj.get("client_turn_id")
        if not is_int(turn) or turn < 1:
            return Owed(index, type_, frozenset({"invalid_client_turn_id"}), eid)
        ack = "input_audio_buffer.turn_started" if type_.endswith("turn_start") else "input_audio_buffer.committed"
        slot = (ack, echo_key(eid), turn)
        barriers[slot] = barriers.get(slot, 0) + 1
        return None
    if type_ == "conversation.item.create":
        item = obj.get("item")
        if not isinstance(item, dict) or item.get("type") != "function_call_output":
            return Owed(index, type_, frozenset({"invalid_conversation_item"}), echo)
        return None
    if type_ == "session.update":
        if not isinstance(obj.get("session"), dict):
            return Owed(index, type_, frozenset({"invalid_session_update", "settings_locked"}), echo)
        return None
    if type_ == "input_text.request":
        return Owed(index, type_, frozenset(), echo, deferrable=True, job=echo_key(obj.get("job_id")))
    if type_ == "session.stop":
        stops.append(index)
    return None


def predict_tiered(index: int, obj: Any, raw: Any, stops: list[int]) -> Owed | None:
    """What a tiered client event is owed (``raw``: its frame, for the size limit); notes a close
    (``stops``)."""
    if obj is BINARY:
        code = "event_too_large" if len(raw) > TIERED_MAX_FRAME_BYTES else "bad_event"
        return Owed(index, "<binary>", frozenset({code}), None)
    if isinstance(raw, str) and len(raw.encode("utf-8", "surrogatepass")) > TIERED_MAX_FRAME_BYTES:
        return Owed(index, "<too large>", frozenset({"event_too_large"}), None)
    if obj is TOO_COMPLEX:
        return Owed(index, "<too complex>", frozenset({"event_too_large"}), None)
    if obj is INVALID:
        return Owed(index, "<invalid json>", frozenset({"invalid_json"}), None)
    if not isinstance(obj, dict):
        return Owed(index, "<not an object>", frozenset({"bad_event"}), None)
    eid = obj.get("event_id")
    type_ = obj.get("type")
    name = type_ if isinstance(type_, str) and type_ else "<no type>"
    if eid is not None and (not isinstance(eid, str) or len(eid) > MAX_ECHOED_ID_CHARS):
        return Owed(index, name, frozenset({"bad_event"}), None)
    if not isinstance(type_, str) or not type_:
        return Owed(index, name, frozenset({"bad_event"}), eid)
    if type_ not in TIERED_CLIENT_TYPES:
        return Owed(index, type_, frozenset({"unknown_event"}), eid)
    if type_ == "session.resume" and index > 0:
        return Owed(index, type_, frozenset({"unsupported_session_resume", "invalid_session_resume"}), eid)
    if type_ == "input_audio_buffer.append":
        audio = obj.get("audio")
        if audio is None and obj.get("video_frames") is None:
            return Owed(index, type_, frozenset({"bad_event"}), eid)
        if audio is not None and not isinstance(audio, str):
            return Owed(index, type_, frozenset({"bad_event"}), eid)
        plain = all(obj.get(k) is None for k in ("format", "input_audio_format", "sample_rate_hz",
                                                 "sample_rate", "video_frames", "is_speech"))
        if plain and isinstance(audio, str) and not _strict_b64(audio):
            return Owed(index, type_, frozenset({"bad_audio"}), eid)
        return None
    if type_ == "session.update" and "session" in obj and not isinstance(obj["session"], dict):
        return Owed(index, type_, frozenset({"bad_event"}), eid)
    if type_ == "session.event_ack":
        seq = obj.get("server_event_seq")
        if not is_int(seq) or seq < 0:
            return Owed(index, type_, frozenset({"invalid_event_ack"}), eid)
        return None
    if type_ in _TIERED_CLOSE_TYPES:
        stops.append(index)
    return None


def expected_text(owed: Owed) -> str:
    if owed.job is not None:
        return f"input_text.accepted/rejected for job_id {owed.job}"
    echo = "" if owed.echo is None else f" echoing {owed.echo!r}"
    return f"error {'|'.join(sorted(owed.codes))}{echo}"


def _strict_b64(text: str) -> bool:
    try:
        base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return False
    return True


def _v3_append_code(msg: dict) -> str | None:
    """The code the contract's append validation (§4, checks 2-7) gives, or None for a valid append."""
    if msg.get("encoding") != "pcm16":
        return "unsupported_audio_encoding"
    rate = msg.get("sample_rate")
    if not (is_int(rate) and rate == 16_000):
        return "unsupported_sample_rate"
    channels = msg.get("channels")
    if not (is_int(channels) and channels == 1):
        return "unsupported_channel_count"
    audio = msg.get("audio")
    if audio is None or audio == "":
        return "empty_audio"
    if not isinstance(audio, str):
        return "invalid_audio"
    try:
        pcm = base64.b64decode(audio.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return "invalid_audio"
    if len(pcm) % 2:
        return "invalid_audio"
    if len(pcm) > MAX_V3_APPEND_BYTES:
        return "audio_packet_too_large"
    return None
