"""The tiered dialect's client-event parser (docs/tiered-dialect.md §2, §3.5, §8.1-§8.2)."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.wire.tiered import parser as p
from vllm_omni_voicechat.wire.tiered.parser import ClientEvent, ParseError, parse


def ok(event: dict, cls: type[ClientEvent]) -> ClientEvent:
    result = parse(json.dumps(event))
    assert isinstance(result, cls), result
    assert result.type == event["type"]
    assert result.event_id == event.get("event_id")
    return result


def err(frame: str | bytes | dict, code: str, param: str | None = ..., event_id: str | None = ...) -> ParseError:
    result = parse(json.dumps(frame) if isinstance(frame, dict) else frame)
    assert isinstance(result, ParseError), result
    assert result.code == code, result
    if param is not ...:
        assert result.param == param, result
    if event_id is not ...:
        assert result.event_id == event_id
    elif isinstance(frame, dict) and isinstance(frame.get("event_id"), str):
        assert result.event_id == frame["event_id"]
    return result


B64 = base64.b64encode(b"\x01\x02\x03\x04").decode()

# one minimal valid instance per canonical type (the doc's 20 table rows)
MINIMAL: dict[str, tuple[dict, type]] = {
    "session.update": ({"session": {"voice": "x"}}, p.SessionUpdate),
    "session.heartbeat": ({}, p.SessionHeartbeat),
    "session.event_ack": ({"server_event_seq": 3}, p.SessionEventAck),
    "session.close": ({}, p.SessionClose),
    "session.resume": ({"session_id": "s", "resume_token": "t"}, p.SessionResume),
    "input_audio_buffer.append": ({"audio": B64}, p.InputAudioBufferAppend),
    "input_audio_buffer.commit": ({}, p.InputAudioBufferCommit),
    "input_audio_buffer.clear": ({}, p.InputAudioBufferClear),
    "input.cancel": ({}, p.InputCancel),
    "input.text.append": ({"text": "hi"}, p.InputTextAppend),
    "conversation.item.create": ({"item": {"type": "message"}}, p.ConversationItemCreate),
    "conversation.item.retrieve": ({"item_id": "i"}, p.ConversationItemRetrieve),
    "conversation.item.delete": ({"item_id": "i"}, p.ConversationItemDelete),
    "conversation.item.truncate": ({"item_id": "i", "audio_end_ms": 10}, p.ConversationItemTruncate),
    "response.create": ({}, p.ResponseCreate),
    "response.cancel": ({}, p.ResponseCancel),
    "output_audio_buffer.clear": ({}, p.OutputAudioBufferClear),
    "barge_in": ({}, p.BargeIn),
    "turn.signal": ({"event": "barge_in"}, p.TurnSignal),
    "playback.ack": ({"played_ms": 120}, p.PlaybackAck),
}
ALIASES = {
    "close": "session.close",
    "close_session": "session.close",
    "input.commit": "input_audio_buffer.commit",
    "input_text.append": "input.text.append",
    "push_text": "input.text.append",
    "signal_turn": "turn.signal",
    "audio.playback_ack": "playback.ack",
}


def test_catalogue_matches_doc() -> None:
    assert set(MINIMAL) == {cls.canonical for cls in p.EVENT_CLASSES}
    assert set(p.EVENT_TYPES) == set(MINIMAL) | set(ALIASES)
    for alias, canonical in ALIASES.items():
        assert p.EVENT_TYPES[alias] is p.EVENT_TYPES[canonical]


@pytest.mark.parametrize("kind", sorted(MINIMAL))
def test_every_canonical_type(kind: str) -> None:
    fields, cls = MINIMAL[kind]
    event = ok({"type": kind, "event_id": "evt_1", **fields}, cls)
    assert type(event).canonical == kind
    ok({"type": kind, **fields}, cls)  # event_id optional


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_every_alias_folds(alias: str) -> None:
    fields, cls = MINIMAL[ALIASES[alias]]
    event = ok({"type": alias, "event_id": "e", **fields}, cls)
    assert event.type == alias and type(event).canonical == ALIASES[alias]


def test_events_are_frozen() -> None:
    event = parse('{"type":"input.text.append","text":"x"}')
    with pytest.raises(AttributeError):
        event.text = "y"  # type: ignore[misc]


# ------------------------------------------------------------------------------------------- fields


def test_session_update_fields() -> None:
    assert ok({"type": "session.update", "session": {"voice": "v"}}, p.SessionUpdate).session == {"voice": "v"}
    flat = ok({"type": "session.update", "event_id": "e", "voice": "v", "modalities": ["audio"]}, p.SessionUpdate)
    assert flat.session == {"voice": "v", "modalities": ["audio"]}


def test_close_and_resume_and_ack_fields() -> None:
    assert ok({"type": "session.close"}, p.SessionClose).reason == "client_close"
    assert ok({"type": "close", "reason": "bye"}, p.SessionClose).reason == "bye"
    r = ok({"type": "session.resume", "session_id": "s", "resume_token": "t",
            "last_received_server_event_seq": 7}, p.SessionResume)
    assert (r.session_id, r.resume_token, r.last_received_server_event_seq) == ("s", "t", 7)
    assert ok(MINIMAL["session.resume"][0] | {"type": "session.resume"}, p.SessionResume) \
        .last_received_server_event_seq == 0
    assert ok({"type": "session.event_ack", "server_event_seq": 0}, p.SessionEventAck).server_event_seq == 0


def test_append_fields() -> None:
    raw = b"\x00\x01" * 8
    a = ok({"type": "input_audio_buffer.append", "audio": base64.b64encode(raw).decode(), "format": "s16le",
            "sample_rate": 24000, "is_speech": True, "duration_ms": 5, "vad": {"x": 1}}, p.InputAudioBufferAppend)
    assert (a.audio, a.format, a.sample_rate_hz, a.is_speech) == (raw, "pcm16", 24000, True)
    assert a.hints == {"duration_ms": 5, "vad": {"x": 1}}
    ga = ok({"type": "input_audio_buffer.append", "audio": "",
             "input_audio_format": {"type": "audio/pcma", "rate": 8000}}, p.InputAudioBufferAppend)
    assert (ga.audio, ga.format, ga.sample_rate_hz) == (b"", "g711_alaw", 8000)
    both = ok({"type": "input_audio_buffer.append", "audio": B64, "sample_rate_hz": 48000,
               "format": {"type": "audio/pcm", "rate": 16000}}, p.InputAudioBufferAppend)
    assert both.sample_rate_hz == 48000  # the explicit rate wins over the format's
    v = ok({"type": "input_audio_buffer.append", "video_frames": ["abc"]}, p.InputAudioBufferAppend)
    assert v.audio is None and v.video_frames == ("abc",) and v.format is None and v.sample_rate_hz is None


@pytest.mark.parametrize("name,canonical", [
    ("pcm16", "pcm16"), ("pcm_s16le", "pcm16"), ("pcm", "pcm16"), ("audio/pcm", "pcm16"),
    ("pcm_f32le", "pcm_f32le"), ("f32le", "pcm_f32le"), ("audio/pcm_f32le", "pcm_f32le"),
    ("g711_ulaw", "g711_ulaw"), ("audio/pcmu", "g711_ulaw"), ("mulaw", "g711_ulaw"), ("g711-ulaw", "g711_ulaw"),
    ("audio/g711_ulaw", "g711_ulaw"), ("ulaw", "g711_ulaw"),
    ("g711_alaw", "g711_alaw"), ("audio/pcma", "g711_alaw"), ("alaw", "g711_alaw"), ("g711-alaw", "g711_alaw"),
    ("audio/g711_alaw", "g711_alaw"),
])
def test_input_format_aliases(name: str, canonical: str) -> None:
    a = ok({"type": "input_audio_buffer.append", "audio": B64, "format": name}, p.InputAudioBufferAppend)
    assert a.format == canonical


def test_commit_fields() -> None:
    c = ok({"type": "input.commit"}, p.InputAudioBufferCommit)
    assert (c.final, c.response_create, c.is_speech) == (True, None, None)
    c = ok({"type": "input_audio_buffer.commit", "final": False, "create_response": True, "is_speech": False},
           p.InputAudioBufferCommit)
    assert (c.final, c.response_create, c.is_speech) == (False, True, False)
    c = ok({"type": "input_audio_buffer.commit", "response_create": False}, p.InputAudioBufferCommit)
    assert c.response_create is False


def test_item_fields() -> None:
    item = {"type": "function_call_output", "call_id": "c1", "output": "{}"}
    c = ok({"type": "conversation.item.create", "item": item, "previous_item_id": "p"}, p.ConversationItemCreate)
    assert (c.item, c.previous_item_id) == (item, "p")
    audio_item = {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": B64,
                                                                   "format": "audio/pcmu"}]}
    ok({"type": "conversation.item.create", "item": audio_item}, p.ConversationItemCreate)
    assert ok({"type": "conversation.item.retrieve", "item_id": "i1"}, p.ConversationItemRetrieve).item_id == "i1"
    assert ok({"type": "conversation.item.delete", "item_id": "i2"}, p.ConversationItemDelete).item_id == "i2"
    t = ok({"type": "conversation.item.truncate", "item_id": "i", "audio_end_ms": 12.5, "content_index": 1},
           p.ConversationItemTruncate)
    assert (t.item_id, t.audio_end_ms, t.content_index) == ("i", 12.5, 1)
    assert ok({"type": "conversation.item.truncate", "item_id": "i", "audio_end_ms": 0},
              p.ConversationItemTruncate).content_index == 0


def test_response_fields() -> None:
    r = ok({"type": "response.create", "response": {"metadata": {"k": "v"}, "modalities": ["audio"],
                                                    "conversation": "auto", "output_audio_format": "audio/pcmu"}},
           p.ResponseCreate)
    assert r.response["conversation"] == "auto" and r.output_format == "g711_ulaw"
    ga = ok({"type": "response.create",
             "response": {"audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}}}}}, p.ResponseCreate)
    assert (ga.output_format, ga.output_sample_rate_hz) == ("pcm16", 24000)
    assert ok({"type": "response.create"}, p.ResponseCreate).response is None
    assert ok({"type": "response.cancel", "response_id": "r"}, p.ResponseCancel).response_id == "r"
    assert ok({"type": "response.cancel"}, p.ResponseCancel).response_id is None
    assert ok({"type": "output_audio_buffer.clear", "response_id": "r"}, p.OutputAudioBufferClear).response_id == "r"


def test_turn_signal_and_playback_fields() -> None:
    s = ok({"type": "signal_turn", "event": "custom", "payload": {"a": 1}}, p.TurnSignal)
    assert (s.event, s.payload) == ("custom", {"a": 1})
    a = ok({"type": "audio.playback_ack", "played_ms": -5, "committed_ms": 3.5, "response_id": "r",
            "item_id": "i", "truncate": True}, p.PlaybackAck)
    assert (a.played_ms, a.committed_ms, a.response_id, a.item_id, a.truncate) == (-5, 3.5, "r", "i", True)
    assert ok({"type": "input_text.append", "text": ""}, p.InputTextAppend).text == ""


# ------------------------------------------------------------------------------------------- transport errors


def test_transport_errors() -> None:
    err(b'{"type":"session.heartbeat"}', "bad_event")  # binary frame [decision]
    err("{not json", "invalid_json")
    err("", "invalid_json")
    err('{"type":"playback.ack","played_ms":NaN}', "invalid_json")
    err("[" * 100_000, "event_too_large")  # more containers than MAX_JSON_CONTAINERS: refused undecoded
    err("[" * 10_000 + "]" * 10_000, "invalid_json")  # within the count, deeper than the decoder goes
    for value in ("[1]", "1", '"x"', "null", "true"):
        err(value, "bad_event")
    err({"event_id": "e9"}, "bad_event", param="type", event_id="e9")
    err({"type": 3, "event_id": "e9"}, "bad_event", event_id="e9")
    err({"type": "session.heartbeat", "event_id": 5}, "bad_event", param="event_id", event_id=None)
    err({"type": "session.heartbeat", "event_id": "e" * 257}, "bad_event", param="event_id", event_id=None)  # no echo
    assert isinstance(p.parse(json.dumps({"type": "session.heartbeat", "event_id": "e" * 256})), p.SessionHeartbeat)
    too_big = '{"type":"input.text.append","text":"' + "a" * p.MAX_FRAME_BYTES + '"}'
    err(too_big, "event_too_large")
    err(too_big.encode(), "event_too_large")


@pytest.mark.parametrize("kind", ["push_chunk", "input.audio.append", "response.output_audio.delta",
                                  "session.created", "nonsense", "Session.Update"])
def test_unknown_types(kind: str) -> None:
    err({"type": kind, "event_id": "e7"}, "unknown_event", param="type", event_id="e7")


# ------------------------------------------------------------------------------------------- event errors

BAD: list[tuple[dict, str, str | None]] = [
    ({"type": "session.update", "session": "x"}, "bad_event", "session"),
    ({"type": "session.event_ack"}, "invalid_event_ack", "server_event_seq"),
    ({"type": "session.event_ack", "server_event_seq": -1}, "invalid_event_ack", "server_event_seq"),
    ({"type": "session.event_ack", "server_event_seq": 1.5}, "invalid_event_ack", "server_event_seq"),
    ({"type": "session.event_ack", "server_event_seq": True}, "invalid_event_ack", "server_event_seq"),
    ({"type": "session.close", "reason": 3}, "bad_event", "reason"),
    ({"type": "session.resume", "resume_token": "t"}, "invalid_session_resume", "session_id"),
    ({"type": "session.resume", "session_id": "s"}, "invalid_session_resume", "resume_token"),
    ({"type": "session.resume", "session_id": "s", "resume_token": "t", "last_received_server_event_seq": -1},
     "invalid_session_resume", "last_received_server_event_seq"),
    ({"type": "input_audio_buffer.append"}, "bad_event", "audio"),
    ({"type": "input_audio_buffer.append", "audio": 5}, "bad_event", "audio"),
    ({"type": "input_audio_buffer.append", "audio": "abc"}, "bad_audio", "audio"),  # bad padding
    ({"type": "input_audio_buffer.append", "audio": "AA*="}, "bad_audio", "audio"),  # non-alphabet
    ({"type": "input_audio_buffer.append", "audio": "AA==\n"}, "bad_audio", "audio"),
    ({"type": "input_audio_buffer.append", "audio": "ÄÄ=="}, "bad_audio", "audio"),
    ({"type": "input_audio_buffer.append", "audio": B64, "format": "wav"}, "unsupported_audio_format", "format"),
    ({"type": "input_audio_buffer.append", "audio": B64, "input_audio_format": "opus"},
     "unsupported_audio_format", "input_audio_format"),
    ({"type": "input_audio_buffer.append", "audio": B64, "format": {"type": "audio/mp3"}},
     "unsupported_audio_format", "format"),
    ({"type": "input_audio_buffer.append", "audio": B64, "sample_rate_hz": 7999}, "bad_event", "sample_rate_hz"),
    ({"type": "input_audio_buffer.append", "audio": B64, "sample_rate": 192001}, "bad_event", "sample_rate"),
    ({"type": "input_audio_buffer.append", "audio": B64, "sample_rate_hz": "16000"}, "bad_event", "sample_rate_hz"),
    ({"type": "input_audio_buffer.append", "audio": B64, "format": {"type": "audio/pcm", "rate": 100}},
     "bad_event", "format.rate"),
    ({"type": "input_audio_buffer.append", "video_frames": "abc"}, "invalid_video_frames", "video_frames"),
    ({"type": "input_audio_buffer.append", "audio": B64, "is_speech": "yes"}, "bad_event", "is_speech"),
    ({"type": "input_audio_buffer.commit", "final": 1}, "bad_event", "final"),
    ({"type": "input.commit", "create_response": "true"}, "bad_event", "create_response"),
    ({"type": "input.text.append"}, "bad_event", "text"),
    ({"type": "push_text", "text": 5}, "bad_event", "text"),
    ({"type": "conversation.item.create"}, "bad_event", "item"),
    ({"type": "conversation.item.create", "item": []}, "bad_event", "item"),
    ({"type": "conversation.item.create", "item": {}, "previous_item_id": 4}, "bad_event", "previous_item_id"),
    ({"type": "conversation.item.create", "item": {"type": "function_call_output", "output": "x"}},
     "invalid_function_call_output", "item.call_id"),
    ({"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "c", "output": {}}},
     "invalid_function_call_output", "item.output"),
    ({"type": "conversation.item.create", "item": {"type": "message", "content": [
        {"type": "input_audio", "audio": B64, "format": "flac"}]}}, "unsupported_audio_format",
     "item.content[0].format"),
    ({"type": "conversation.item.retrieve"}, "missing_item_id", "item_id"),
    ({"type": "conversation.item.delete", "item_id": ""}, "missing_item_id", "item_id"),
    ({"type": "conversation.item.truncate", "audio_end_ms": 5}, "missing_item_id", "item_id"),
    ({"type": "conversation.item.truncate", "item_id": "i"}, "bad_event", "audio_end_ms"),
    ({"type": "conversation.item.truncate", "item_id": "i", "audio_end_ms": "5"}, "bad_event", "audio_end_ms"),
    ({"type": "conversation.item.truncate", "item_id": "i", "audio_end_ms": -1}, "bad_event", "audio_end_ms"),
    ({"type": "conversation.item.truncate", "item_id": "i", "audio_end_ms": 1, "content_index": -1},
     "bad_event", "content_index"),
    ({"type": "response.create", "response": "x"}, "bad_event", "response"),
    *[({"type": "response.create", "response": {key: value}}, "unsupported_native_response_options",
       f"response.{key}")
      for key, value in [("voice", "alloy"), ("temperature", 0.5),
                         ("max_output_tokens", 5), ("max_response_output_tokens", "inf"), ("max_tokens", 3),
                         ("tools", []), ("tool_choice", "required"), ("tool_choice", "none")]],
    ({"type": "response.create", "response": {"instructions": 5}}, "bad_event", "response.instructions"),
    *[({"type": "response.create", "response": {"metadata": value}}, "bad_event", "response.metadata")
      for value in ["x", {"k": 1}, {"k" * 65: "v"}, {"k": "v" * 513}, {f"k{i}": "v" for i in range(17)}]],
    ({"type": "response.create", "response": {"output_audio_format": "wav"}}, "unsupported_audio_format",
     "response.output_audio_format"),
    ({"type": "response.create", "response": {"output_audio_format": "pcm_f32le"}}, "unsupported_audio_format",
     "response.output_audio_format"),
    ({"type": "response.create", "response": {"audio": {"output": {"format": {"type": "audio/wav"}}}}},
     "unsupported_audio_format", "response.audio.output.format"),
    ({"type": "response.cancel", "response_id": 1}, "bad_event", "response_id"),
    ({"type": "output_audio_buffer.clear", "response_id": []}, "bad_event", "response_id"),
    ({"type": "turn.signal"}, "bad_event", "event"),
    ({"type": "turn.signal", "event": "  "}, "bad_event", "event"),
    ({"type": "signal_turn", "event": "x", "payload": [1]}, "bad_event", "payload"),
    ({"type": "playback.ack"}, "bad_event", "played_ms"),
    ({"type": "playback.ack", "played_ms": "10"}, "bad_event", "played_ms"),
    ({"type": "audio.playback_ack", "played_ms": True}, "bad_event", "played_ms"),
    ({"type": "playback.ack", "played_ms": 1, "committed_ms": "x"}, "bad_event", "committed_ms"),
    ({"type": "playback.ack", "played_ms": 1, "truncate": "x"}, "bad_event", "truncate"),
]


@pytest.mark.parametrize("event,code,param", BAD, ids=lambda v: v if isinstance(v, str) else None)
def test_event_errors_echo_event_id(event: dict, code: str, param: str | None) -> None:
    e = err({**event, "event_id": "evt_bad"}, code, param=param, event_id="evt_bad")
    assert e.error_class == "invalid_request_error"
    err(event, code, param=param, event_id=None)


def test_error_classes() -> None:
    assert p.error_class("input_backpressure") == "rate_limit_error"
    assert p.error_class("resource_exhausted") == "rate_limit_error"
    assert p.error_class("internal_error") == "server_error"
    assert p.error_class("runtime_resume_failed") == "server_error"
    for code in ("bad_event", "bad_audio", "invalid_json", "event_too_large", "unknown_event", "missing_item_id"):
        assert p.error_class(code) == "invalid_request_error"
    assert ParseError("internal_error", "m").error_class == "server_error"


def test_none_optional_values_count_as_absent() -> None:
    ok({"type": "response.create", "response": {"instructions": None, "voice": None}}, p.ResponseCreate)
    ok({"type": "input_audio_buffer.append", "audio": B64, "format": None, "sample_rate_hz": None},
       p.InputAudioBufferAppend)


# ------------------------------------------------------------------------------------------- properties

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
type_names = st.sampled_from(sorted(p.EVENT_TYPES) + ["push_chunk", "input.audio.append"]) | st.text(max_size=12)
field_names = st.sampled_from(sorted({
    "event_id", "session", "server_event_seq", "reason", "session_id", "resume_token",
    "last_received_server_event_seq", "audio", "video_frames", "format", "input_audio_format", "sample_rate_hz",
    "sample_rate", "is_speech", "final", "response_create", "create_response", "text", "item",
    "previous_item_id", "item_id", "audio_end_ms", "content_index", "response", "response_id", "event",
    "payload", "played_ms", "committed_ms", "truncate",
})) | st.text(max_size=8)
events = st.builds(
    lambda kind, extra: {**extra, "type": kind},
    type_names,
    st.dictionaries(field_names, json_values | st.sampled_from([B64, "abc", "audio/pcmu", {"type": "pcm"}]),
                    max_size=6),
)


def check(result: object) -> None:
    assert isinstance(result, (ClientEvent, ParseError))
    if isinstance(result, ParseError):
        assert isinstance(result.code, str) and result.code and isinstance(result.message, str)
        assert result.error_class == p.error_class(result.code)
        assert not result.message.startswith("malformed event")  # the catch-all guard never fired
    else:
        assert type(result) in p.EVENT_CLASSES


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_arbitrary_json_never_raises(value: object) -> None:
    check(parse(json.dumps(value)))


@settings(max_examples=500, deadline=None)
@given(events, st.one_of(st.none(), st.text(max_size=6)))
def test_arbitrary_event_objects_never_raise(event: dict, event_id: str | None) -> None:
    if event_id is not None:
        event["event_id"] = event_id
    result = parse(json.dumps(event))
    check(result)
    sent_id = event.get("event_id")
    if isinstance(result, ParseError):
        assert result.event_id == (sent_id if isinstance(sent_id, str) else None)
    else:
        assert result.type == event["type"] and result.event_id == sent_id


@settings(max_examples=300, deadline=None)
@given(st.text() | st.binary())
def test_arbitrary_frames_never_raise(frame: str | bytes) -> None:
    check(parse(frame))


def _stdlib_audio(text: str) -> bytes | None:
    import binascii

    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return None


@settings(max_examples=400)
@given(text=st.text("AB+/=Q9\n -_é", max_size=12) | st.sampled_from(["QUJD=", "QUJD==", "QQ==QQ==", "QUJDRA=", "QQ=a"]))
def test_append_audio_accepts_exactly_what_strict_base64_accepts(text: str) -> None:
    """The SIMD decoder refuses excess padding the standard library accepts ("QUJD=" is ABC): the parser still
    accepts and refuses exactly the payloads the standard library's strict mode does."""
    event = parse(json.dumps({"type": "input_audio_buffer.append", "audio": text}))
    expected = _stdlib_audio(text)
    if expected is None:
        assert isinstance(event, ParseError) and event.code == "bad_audio"
    else:
        assert isinstance(event, p.InputAudioBufferAppend) and event.audio == expected
