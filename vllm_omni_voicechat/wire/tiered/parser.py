"""Client → server events of the tiered dialect (pure; docs/tiered-dialect.md §2).

``parse(frame)`` turns one WebSocket frame into one frozen ``ClientEvent`` dataclass per canonical type (aliases
folded; the original ``type`` string and the client ``event_id`` are kept), or a ``ParseError`` carrying the
documented code, its class (§3.5), the echoed ``event_id`` and the offending ``param``.

Only the stateless part of §2 lives here: required fields, JSON types, enums, base64 strictness of
``input_audio_buffer.append.audio`` and format/rate names. Everything that needs session state (the journal head,
the item store, published function calls, the settings lock, "first message only", what the session's own format
is) and the detailed ``session`` rules of §8.3 belong to the session / settings modules. ``parse`` never raises.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import pybase64

from ..limits import MAX_JSON_CONTAINERS, too_many_containers, utf8_exceeds
from ..transport import MAX_ECHOED_ID_CHARS, client_json
from .audio import AudioFormatError, check_sample_rate
from .fields import FieldRejected, format_and_rate, is_number

MAX_FRAME_BYTES = 15 * 1024 * 1024  # §2: frame > 15 MiB → event_too_large

# ---------------------------------------------------------------------------------------------------- error codes

_RATE_LIMIT_CODES = frozenset({"resource_exhausted", "input_backpressure"})
_SERVER_CODES = frozenset(
    {
        "internal_error",
        "response_cancel_timeout",
        "input_turn_settle_timeout",
        "fused_eou_contract_failure",
        "separate_eou_contract_failure",
        "missing_terminal_bos",
        "missing_post_fc_terminal_bos",
        "overlapping_bos_expectation",
        "function_output_apply_timeout",
        "function_call_output_timeout",
        "typed_input_failed",
        "model_cleanup_failed",
        "runtime_resume_failed",
    }
)



def _b64decode(text: str) -> bytes:
    """Strict base64 as the standard library decodes it: pybase64 first (SIMD; an append's 3-5 KB in ~1 us rather
    than ~12), the standard library for whatever pybase64 refuses (it is stricter about excess padding), so exactly
    the same payloads are accepted or refused."""
    try:
        return pybase64.b64decode(text, validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return base64.b64decode(text.encode("ascii"), validate=True)

def error_class(code: str) -> str:
    """The §3.5 class of an error code: every code not listed as rate-limit or server is a request error."""
    if code in _RATE_LIMIT_CODES:
        return "rate_limit_error"
    if code in _SERVER_CODES:
        return "server_error"
    return "invalid_request_error"


@dataclass(frozen=True, slots=True)
class ParseError:
    code: str
    message: str
    event_id: str | None = None
    param: str | None = None
    error_class: str = ""

    def __post_init__(self) -> None:
        if not self.error_class:
            object.__setattr__(self, "error_class", error_class(self.code))


# ---------------------------------------------------------------------------------------------------- formats

# Format names and rate bounds are the audio module's (§8.1 / §8.2); the parser only maps its errors to codes.


def _format(value: Any, param: str, *, output: bool = False) -> tuple[str | None, int | None]:
    """A format given as a string or as a GA object ``{type, rate}`` → (canonical name, rate or None)."""
    if value is None:
        return None, None
    try:
        return format_and_rate(value, param, output=output)
    except AudioFormatError as exc:
        if exc.code == "invalid_sample_rate":
            raise FieldRejected("bad_event", str(exc), exc.param) from None
        raise FieldRejected("unsupported_audio_format", str(exc), param) from None


def _rate(value: Any, param: str) -> int:
    try:
        return check_sample_rate(value, param)
    except AudioFormatError as exc:
        raise FieldRejected("bad_event", str(exc), param) from None


# ---------------------------------------------------------------------------------------------------- field helpers

_MISSING: Any = object()


def _opt_str(obj: dict, key: str, code: str = "bad_event", param: str | None = None) -> str | None:
    value = obj.get(key)
    if value is None or isinstance(value, str):
        return value
    raise FieldRejected(code, f"{key} must be a string", param or key)


def _opt_bool(obj: dict, key: str) -> bool | None:
    value = obj.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise FieldRejected("bad_event", f"{key} must be a boolean", key)


def _opt_obj(obj: dict, key: str) -> dict | None:
    value = obj.get(key)
    if value is None or isinstance(value, dict):
        return value
    raise FieldRejected("bad_event", f"{key} must be an object", key)


def _opt_num(obj: dict, key: str) -> float | int | None:
    value = obj.get(key)
    if value is None or is_number(value):
        return value
    raise FieldRejected("bad_event", f"{key} must be a finite number", key)


def _item_id(obj: dict) -> str:
    value = obj.get("item_id")
    if not isinstance(value, str) or not value:
        raise FieldRejected("missing_item_id", "item_id (a non-empty string) is required", "item_id")
    return value


# ---------------------------------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientEvent:
    """Base of every parsed client event. ``type`` is the string the client sent (possibly an alias)."""

    canonical: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()

    type: str
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionUpdate(ClientEvent):
    canonical: ClassVar[str] = "session.update"
    # the `session` object, or the event itself minus `type`/`event_id`; §8.3 rules are the settings module's
    session: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionHeartbeat(ClientEvent):
    canonical: ClassVar[str] = "session.heartbeat"


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionEventAck(ClientEvent):
    canonical: ClassVar[str] = "session.event_ack"
    server_event_seq: int  # ≥ 0; "≤ head" is checked against the journal


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionClose(ClientEvent):
    canonical: ClassVar[str] = "session.close"
    aliases: ClassVar[tuple[str, ...]] = ("close", "close_session")
    reason: str = "client_close"


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionResume(ClientEvent):
    canonical: ClassVar[str] = "session.resume"
    session_id: str
    resume_token: str
    last_received_server_event_seq: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioBufferAppend(ClientEvent):
    canonical: ClassVar[str] = "input_audio_buffer.append"
    audio: bytes | None = None  # strictly base64-decoded; None when only video frames came
    video_frames: tuple[str, ...] | None = None
    format: str | None = None  # canonical §8.1 name from `format` | `input_audio_format`; None → session
    sample_rate_hz: int | None = None  # `sample_rate_hz` | `sample_rate` | format `rate`; None → session
    is_speech: bool | None = None
    hints: dict = field(default_factory=dict)  # every other key (duration_ms, audio_end_ms, vad, …)


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioBufferCommit(ClientEvent):
    canonical: ClassVar[str] = "input_audio_buffer.commit"
    aliases: ClassVar[tuple[str, ...]] = ("input.commit",)
    final: bool = True
    response_create: bool | None = None  # `response_create` | `create_response`
    is_speech: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioBufferClear(ClientEvent):
    canonical: ClassVar[str] = "input_audio_buffer.clear"


@dataclass(frozen=True, slots=True, kw_only=True)
class InputCancel(ClientEvent):
    canonical: ClassVar[str] = "input.cancel"


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTextAppend(ClientEvent):
    canonical: ClassVar[str] = "input.text.append"
    aliases: ClassVar[tuple[str, ...]] = ("input_text.append", "push_text")
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemCreate(ClientEvent):
    canonical: ClassVar[str] = "conversation.item.create"
    item: dict
    previous_item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemRetrieve(ClientEvent):
    canonical: ClassVar[str] = "conversation.item.retrieve"
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemDelete(ClientEvent):
    canonical: ClassVar[str] = "conversation.item.delete"
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemTruncate(ClientEvent):
    canonical: ClassVar[str] = "conversation.item.truncate"
    item_id: str
    audio_end_ms: float | int  # ≥ 0; clamping to delivered audio is the ledger's
    content_index: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseCreate(ClientEvent):
    canonical: ClassVar[str] = "response.create"
    response: dict | None = None
    output_format: str | None = None  # canonical §8.2 name when the response names one
    output_sample_rate_hz: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseCancel(ClientEvent):
    canonical: ClassVar[str] = "response.cancel"
    response_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputAudioBufferClear(ClientEvent):
    canonical: ClassVar[str] = "output_audio_buffer.clear"
    response_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BargeIn(ClientEvent):
    canonical: ClassVar[str] = "barge_in"


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnSignal(ClientEvent):
    canonical: ClassVar[str] = "turn.signal"
    aliases: ClassVar[tuple[str, ...]] = ("signal_turn",)
    event: str
    payload: dict | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PlaybackAck(ClientEvent):
    canonical: ClassVar[str] = "playback.ack"
    aliases: ClassVar[tuple[str, ...]] = ("audio.playback_ack",)
    played_ms: float | int  # not range-checked: the ledger clamps 0/negative/overshoot (§5)
    committed_ms: float | int | None = None
    response_id: str | None = None
    item_id: str | None = None
    truncate: bool | None = None


EVENT_CLASSES: tuple[type[ClientEvent], ...] = (
    SessionUpdate,
    SessionHeartbeat,
    SessionEventAck,
    SessionClose,
    SessionResume,
    InputAudioBufferAppend,
    InputAudioBufferCommit,
    InputAudioBufferClear,
    InputCancel,
    InputTextAppend,
    ConversationItemCreate,
    ConversationItemRetrieve,
    ConversationItemDelete,
    ConversationItemTruncate,
    ResponseCreate,
    ResponseCancel,
    OutputAudioBufferClear,
    BargeIn,
    TurnSignal,
    PlaybackAck,
)

# every accepted type string (canonical and alias) → its class
EVENT_TYPES: Mapping[str, type[ClientEvent]] = {
    name: cls for cls in EVENT_CLASSES for name in (cls.canonical, *cls.aliases)
}

# ---------------------------------------------------------------------------------------------------- builders

_ENVELOPE = ("type", "event_id")


def _session_update(obj: dict, base: dict) -> ClientEvent:
    if "session" in obj:
        session = obj["session"]
        if not isinstance(session, dict):
            raise FieldRejected("bad_event", "session must be an object", "session")
    else:
        session = {k: v for k, v in obj.items() if k not in _ENVELOPE}
    return SessionUpdate(**base, session=dict(session))


def _event_ack(obj: dict, base: dict) -> ClientEvent:
    seq = obj.get("server_event_seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise FieldRejected("invalid_event_ack", "server_event_seq must be an integer >= 0", "server_event_seq")
    return SessionEventAck(**base, server_event_seq=seq)


def _close(obj: dict, base: dict) -> ClientEvent:
    reason = _opt_str(obj, "reason")
    return SessionClose(**base, reason=reason if reason else "client_close")


def _resume(obj: dict, base: dict) -> ClientEvent:
    code = "invalid_session_resume"
    for key in ("session_id", "resume_token"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            raise FieldRejected(code, f"{key} (a non-empty string) is required", key)
    cursor = obj.get("last_received_server_event_seq", 0)
    if cursor is None:
        cursor = 0
    if isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 0:
        raise FieldRejected(code, "last_received_server_event_seq must be an integer >= 0",
                            "last_received_server_event_seq")
    return SessionResume(
        **base,
        session_id=obj["session_id"],
        resume_token=obj["resume_token"],
        last_received_server_event_seq=cursor,
    )


_APPEND_KNOWN = frozenset(
    {"type", "event_id", "audio", "video_frames", "format", "input_audio_format", "sample_rate_hz", "sample_rate",
     "is_speech"}
)


def _append(obj: dict, base: dict) -> ClientEvent:
    audio_b64 = obj.get("audio")
    frames = obj.get("video_frames")
    if audio_b64 is None and frames is None:
        raise FieldRejected("bad_event", "input_audio_buffer.append needs audio and/or video_frames", "audio")
    if audio_b64 is not None and not isinstance(audio_b64, str):
        raise FieldRejected("bad_event", "audio must be a base64 string", "audio")
    video: tuple[str, ...] | None = None
    if frames is not None:
        if not isinstance(frames, list) or not all(isinstance(f, str) for f in frames):
            raise FieldRejected("invalid_video_frames", "video_frames must be a list of strings", "video_frames")
        video = tuple(frames)
    fmt_key = "format" if obj.get("format") is not None else "input_audio_format"
    fmt, fmt_rate = _format(obj.get(fmt_key), fmt_key)
    rate: int | None = None
    for key in ("sample_rate_hz", "sample_rate"):
        if obj.get(key) is not None:
            rate = _rate(obj[key], key)
            break
    if rate is None:
        rate = fmt_rate
    is_speech = _opt_bool(obj, "is_speech")
    audio: bytes | None = None
    if audio_b64 is not None:
        try:
            audio = _b64decode(audio_b64)
        except (binascii.Error, ValueError, UnicodeEncodeError):
            raise FieldRejected("bad_audio", "audio is not valid base64", "audio") from None
    hints = {k: v for k, v in obj.items() if k not in _APPEND_KNOWN}
    return InputAudioBufferAppend(
        **base, audio=audio, video_frames=video, format=fmt, sample_rate_hz=rate, is_speech=is_speech, hints=hints
    )


def _commit(obj: dict, base: dict) -> ClientEvent:
    final = _opt_bool(obj, "final")
    key = "response_create" if obj.get("response_create") is not None else "create_response"
    return InputAudioBufferCommit(
        **base,
        final=True if final is None else final,
        response_create=_opt_bool(obj, key),
        is_speech=_opt_bool(obj, "is_speech"),
    )


def _text_append(obj: dict, base: dict) -> ClientEvent:
    text = obj.get("text")
    if not isinstance(text, str):
        raise FieldRejected("bad_event", "text must be a string", "text")
    return InputTextAppend(**base, text=text)


def _item_create(obj: dict, base: dict) -> ClientEvent:
    item = obj.get("item")
    if not isinstance(item, dict):
        raise FieldRejected("bad_event", "item must be an object", "item")
    previous = _opt_str(obj, "previous_item_id")
    if item.get("type") == "function_call_output":
        if not isinstance(item.get("call_id"), str) or not item["call_id"]:
            raise FieldRejected("invalid_function_call_output", "item.call_id must be a non-empty string",
                                "item.call_id")
        if not isinstance(item.get("output"), str):
            raise FieldRejected("invalid_function_call_output", "item.output must be a string", "item.output")
    content = item.get("content")
    if isinstance(content, list):
        for i, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") in ("input_audio", "audio"):
                for key in ("format", "input_audio_format"):
                    if part.get(key) is not None:
                        _format(part[key], f"item.content[{i}].{key}")
    return ConversationItemCreate(**base, item=dict(item), previous_item_id=previous)


def _retrieve(obj: dict, base: dict) -> ClientEvent:
    return ConversationItemRetrieve(**base, item_id=_item_id(obj))


def _delete(obj: dict, base: dict) -> ClientEvent:
    return ConversationItemDelete(**base, item_id=_item_id(obj))


def _truncate(obj: dict, base: dict) -> ClientEvent:
    item_id = _item_id(obj)
    end = obj.get("audio_end_ms")
    if not is_number(end):
        raise FieldRejected("bad_event", "audio_end_ms must be a finite number", "audio_end_ms")
    if end < 0:
        raise FieldRejected("bad_event", "audio_end_ms must be >= 0", "audio_end_ms")
    index = obj.get("content_index", 0)
    if index is None:
        index = 0
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise FieldRejected("bad_event", "content_index must be an integer >= 0", "content_index")
    return ConversationItemTruncate(**base, item_id=item_id, audio_end_ms=end, content_index=index)


_UNSUPPORTED_RESPONSE_KEYS = ("voice", "temperature", "tools")
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
"""OpenAI's bounds on ``metadata``: 16 pairs, keys of 64 characters, string values of 512."""
_MAX_TOKENS = re.compile(r"^max_.*tokens$")


def _response_create(obj: dict, base: dict) -> ClientEvent:
    response = _opt_obj(obj, "response")
    fmt: str | None = None
    rate: int | None = None
    if response is not None:
        instructions = response.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise FieldRejected("bad_event", "response.instructions must be a string", "response.instructions")
        for key in response:
            if key == "tool_choice" and response[key] == "auto":
                continue  # the session's own (the only one it takes): no override (LiveKit sends it after a tool)
            if response[key] is not None and (key in _UNSUPPORTED_RESPONSE_KEYS or key == "tool_choice"
                                              or _MAX_TOKENS.match(key)):
                raise FieldRejected(
                    "unsupported_native_response_options",
                    f"response.{key} is not supported by this model",
                    f"response.{key}",
                )
        for key in ("output_audio_format", "response_format"):
            if response.get(key) is not None:
                fmt, rate = _format(response[key], f"response.{key}", output=True)
                break
        audio = response.get("audio")
        output = audio.get("output") if isinstance(audio, dict) else None
        if fmt is None and isinstance(output, dict) and output.get("format") is not None:
            fmt, rate = _format(output["format"], "response.audio.output.format", output=True)
        response = dict(response)
        _check_metadata(response.get("metadata"))
    return ResponseCreate(**base, response=response, output_format=fmt, output_sample_rate_hz=rate)


def _check_metadata(metadata: Any) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise FieldRejected("bad_event", "response.metadata must be an object", "response.metadata")
    if len(metadata) > MAX_METADATA_PAIRS:
        raise FieldRejected("bad_event", f"response.metadata holds at most {MAX_METADATA_PAIRS} pairs",
                            "response.metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS or not isinstance(value, str) or len(value) > MAX_METADATA_VALUE_CHARS:
            raise FieldRejected("bad_event", f"response.metadata keys are at most {MAX_METADATA_KEY_CHARS} "
                                f"characters and values strings of at most {MAX_METADATA_VALUE_CHARS}",
                                "response.metadata")


def _response_cancel(obj: dict, base: dict) -> ClientEvent:
    return ResponseCancel(**base, response_id=_opt_str(obj, "response_id"))


def _output_clear(obj: dict, base: dict) -> ClientEvent:
    return OutputAudioBufferClear(**base, response_id=_opt_str(obj, "response_id"))


def _turn_signal(obj: dict, base: dict) -> ClientEvent:
    event = obj.get("event")
    if not isinstance(event, str) or not event.strip():
        raise FieldRejected("bad_event", "event must be a non-empty string", "event")
    payload = _opt_obj(obj, "payload")
    return TurnSignal(**base, event=event, payload=None if payload is None else dict(payload))


def _playback_ack(obj: dict, base: dict) -> ClientEvent:
    played = obj.get("played_ms")
    if not is_number(played):
        raise FieldRejected("bad_event", "played_ms must be a finite number", "played_ms")
    return PlaybackAck(
        **base,
        played_ms=played,
        committed_ms=_opt_num(obj, "committed_ms"),
        response_id=_opt_str(obj, "response_id"),
        item_id=_opt_str(obj, "item_id"),
        truncate=_opt_bool(obj, "truncate"),
    )


def _bare(cls: type[ClientEvent]):
    def build(obj: dict, base: dict) -> ClientEvent:
        return cls(**base)

    return build


_BUILDERS = {
    SessionUpdate: _session_update,
    SessionHeartbeat: _bare(SessionHeartbeat),
    SessionEventAck: _event_ack,
    SessionClose: _close,
    SessionResume: _resume,
    InputAudioBufferAppend: _append,
    InputAudioBufferCommit: _commit,
    InputAudioBufferClear: _bare(InputAudioBufferClear),
    InputCancel: _bare(InputCancel),
    InputTextAppend: _text_append,
    ConversationItemCreate: _item_create,
    ConversationItemRetrieve: _retrieve,
    ConversationItemDelete: _delete,
    ConversationItemTruncate: _truncate,
    ResponseCreate: _response_create,
    ResponseCancel: _response_cancel,
    OutputAudioBufferClear: _output_clear,
    BargeIn: _bare(BargeIn),
    TurnSignal: _turn_signal,
    PlaybackAck: _playback_ack,
}

# ---------------------------------------------------------------------------------------------------- entry point


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)
"""Built once: ``json.loads`` with a keyword builds a decoder per call (~3 us a frame)."""


def parse(text: str | bytes) -> ClientEvent | ParseError:
    """One client frame → a ``ClientEvent`` or a ``ParseError``; never raises. ``bytes`` is a binary frame."""
    try:
        return _parse(text)
    except Exception as exc:  # defensive: the contract is "never raises"
        return ParseError("bad_event", f"malformed event: {type(exc).__name__}")


def _parse(text: str | bytes) -> ClientEvent | ParseError:
    if utf8_exceeds(text, MAX_FRAME_BYTES):
        return ParseError("event_too_large", f"event exceeds {MAX_FRAME_BYTES} bytes")
    if not isinstance(text, str):
        return ParseError("bad_event", "binary frames are not accepted; send JSON text")
    if too_many_containers(text):
        return ParseError("event_too_large", f"event has more than {MAX_JSON_CONTAINERS} JSON objects and arrays")
    try:
        obj = client_json(text, _DECODER.decode)
    except (ValueError, RecursionError):
        return ParseError("invalid_json", "event is not valid JSON")
    return _parse_object(obj)


def parse_object(obj: Any) -> ClientEvent | ParseError:
    """An already decoded client event (e.g. one carried in a ``turn.signal`` payload); never raises."""
    try:
        return _parse_object(obj)
    except Exception as exc:  # defensive, as parse()
        return ParseError("bad_event", f"malformed event: {type(exc).__name__}")


def _parse_object(obj: Any) -> ClientEvent | ParseError:
    if not isinstance(obj, dict):
        return ParseError("bad_event", "event must be a JSON object")
    event_id = obj.get("event_id")
    if event_id is not None and not isinstance(event_id, str):
        return ParseError("bad_event", "event_id must be a string", None, "event_id")
    if event_id is not None and len(event_id) > MAX_ECHOED_ID_CHARS:  # every error echoes it: no amplification
        return ParseError("bad_event", f"event_id is longer than {MAX_ECHOED_ID_CHARS} characters", None, "event_id")
    kind = obj.get("type")
    if not isinstance(kind, str) or not kind:
        return ParseError("bad_event", "event type (a non-empty string) is required", event_id, "type")
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        return ParseError("unknown_event", f"unknown event type {kind!r}", event_id, "type")
    try:
        return _BUILDERS[cls](obj, {"type": kind, "event_id": event_id})
    except FieldRejected as rej:
        return ParseError(rej.code, rej.message, event_id, rej.param)
