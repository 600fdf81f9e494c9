"""The v3 dialect's client-event parser (wire/v3/parser.py): each event's typed value, each refusal's code, and that
no frame makes it raise. The order of checks against session state is the connection's (tests/test_v3_errors.py)."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.model.port import ToolSpec
from vllm_omni_voicechat.wire.limits import MAX_INSTRUCTIONS_CHARS, MAX_JSON_CONTAINERS
from vllm_omni_voicechat.wire.transport import MAX_ECHOED_ID_CHARS
from vllm_omni_voicechat.wire.v3 import parser as p

PCM = bytes(range(256)) * 10
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


def env(event: dict) -> p.Envelope:
    result = p.read(json.dumps(event))
    assert isinstance(result, p.Envelope), result
    return result


def append(**fields) -> dict:
    return {"type": "input_audio_buffer.append", "event_id": "a1", "encoding": "pcm16", "sample_rate": 16000,
            "channels": 1, "audio": base64.b64encode(PCM).decode(), **fields}


@pytest.mark.parametrize("frame, code, event_id", [
    (b"\x00\x01", "binary_audio_unsupported", None),
    ("{nope", "invalid_json", None),
    ("[1, 2]", "invalid_event", None),
    ('"text"', "invalid_event", None),
    ('{"type": "response.cancel", "event_id": "x"}', "unsupported_event", "x"),
    ('{"type": 7, "event_id": 3}', "unsupported_event", 3),
    ('{"event_id": true}', "unsupported_event", None),
    ("[" * 5000 + "]" * 5000, "invalid_json", None),
    ("[" + "[]," * MAX_JSON_CONTAINERS + "[]]", "event_too_large", None),
])
def test_frames_invalid_on_their_face(frame, code, event_id):
    result = p.read(frame)
    assert isinstance(result, p.Refused) and result.code == code and result.event_id == event_id
    assert not result.fatal


def test_an_id_too_long_to_echo_is_not_echoed():
    long_id = "x" * (MAX_ECHOED_ID_CHARS + 1)
    assert p.read(json.dumps({"type": "bogus", "event_id": long_id})).event_id is None
    assert env({"type": "session.stop", "event_id": long_id}).event_id is None
    assert env({"type": "session.stop", "event_id": "x" * MAX_ECHOED_ID_CHARS}).event_id == "x" * MAX_ECHOED_ID_CHARS


def test_session_update_fields():
    update = p.session_update(env({"type": "session.update", "event_id": "u1", "session": {
        "protocol_version": 3, "instructions": "Be brief.", "tools": [TOOL],
        "capabilities": {"function_output_model_output": "client_authored_v1"}}}))
    assert update == p.SessionUpdate("u1", 3, None, "client_authored_v1", "Be brief.",
                                     (ToolSpec("lookup", "", {"type": "object"}),), None)
    bare = p.session_update(env({"type": "session.update", "session": {}}))
    assert (bare.version, bare.model_output_mode, bare.instructions, bare.tools) == (p.MISSING,) * 4
    cleared = p.session_update(env({"type": "session.update", "session": {"instructions": None, "tools": None}}))
    assert cleared.instructions is None and cleared.tools == ()
    assert p.session_update(env({"type": "session.update", "session": {"instructions": {"a": 1}}})).instructions \
        == '{"a": 1}'


@pytest.mark.parametrize("session, where, code", [
    (False, "refused", "invalid_session_update"),
    ({"capabilities": []}, "capabilities", "invalid_session_capabilities"),
    ({"capabilities": {"function_output_model_output": "other"}}, "capabilities", "unsupported_session_capability"),
    ({"instructions": "i" * (MAX_INSTRUCTIONS_CHARS + 1)}, "problem", "invalid_session_update"),
    ({"tools": [{"type": "function"}]}, "problem", "invalid_tools"),
    ({"instructions": "i" * (MAX_INSTRUCTIONS_CHARS + 1), "tools": "bad"}, "problem", "invalid_session_update"),
])
def test_session_update_problems_keep_their_place_in_the_order(session, where, code):
    result = p.session_update(env({"type": "session.update", "event_id": "u", "session": session}))
    refused = result if where == "refused" else getattr(result, where)
    assert isinstance(refused, p.Refused) and refused.code == code and refused.event_id == "u"
    if where == "problem":
        assert result.tools is p.MISSING


def test_append_decodes_or_refuses_in_the_contracts_order():
    assert p.append(env(append())) == p.Append("a1", PCM)
    for fields, code in [({"encoding": "opus"}, "unsupported_audio_encoding"),
                         ({"sample_rate": 16000.0}, "unsupported_sample_rate"),
                         ({"channels": 2}, "unsupported_channel_count"), ({"audio": ""}, "empty_audio"),
                         ({"audio": 5}, "invalid_audio"), ({"audio": "!!"}, "invalid_audio"),
                         ({"encoding": "opus", "audio": 5}, "unsupported_audio_encoding")]:
        refused = p.append(env(append(**fields)))
        assert isinstance(refused, p.Refused) and refused.code == code and refused.event_id == "a1", fields


def test_barriers_and_their_violations():
    start = {"type": "input_audio_buffer.turn_start", "event_id": "ts", "client_turn_id": 4}
    assert p.barrier(env(start)) == p.TurnStart("ts", 4)
    assert p.barrier(env({**start, "type": "input_audio_buffer.commit"})) == p.Commit("ts", 4)
    for fields, code, echo in [({"event_id": ""}, "invalid_event_id", None), ({"event_id": 5}, "invalid_event_id", None),
                               ({"client_turn_id": 0}, "invalid_client_turn_id", "ts"),
                               ({"client_turn_id": True}, "invalid_client_turn_id", "ts"),
                               ({"client_turn_id": 1.0}, "invalid_client_turn_id", "ts")]:
        refused = p.barrier(env({**start, **fields}))
        assert isinstance(refused, p.Refused) and refused.fatal and (refused.code, refused.event_id) == (code, echo)


def test_typed_request_item_and_stop():
    assert p.typed_request(env({"type": "input_text.request", "event_id": "t", "job_id": None, "text": 3})) == \
        p.TypedRequest("t", None, 3)
    item = {"type": "function_call_output", "call_id": "c", "output": "o"}
    assert p.item_create(env({"type": "conversation.item.create", "event_id": "f", "item": item})) == \
        p.FunctionOutput("f", "c", "o", None)
    for bad in (None, [], {"type": "message"}):
        refused = p.item_create(env({"type": "conversation.item.create", "event_id": "f", "item": bad}))
        assert isinstance(refused, p.Refused) and refused.code == "invalid_conversation_item"
    assert p.stop(env({"type": "session.stop", "event_id": 9})) == p.Stop(9)


_PARSERS = {"session.update": p.session_update, "input_audio_buffer.append": p.append,
            "input_audio_buffer.turn_start": p.barrier, "input_audio_buffer.commit": p.barrier,
            "input_text.request": p.typed_request, "conversation.item.create": p.item_create,
            "session.stop": p.stop}
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=4), max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(p.TYPES)), st.dictionaries(
    st.sampled_from(["event_id", "session", "audio", "encoding", "sample_rate", "channels", "client_turn_id",
                     "job_id", "text", "item"]), _JSON, max_size=6))
def test_no_event_of_a_known_type_makes_its_parser_raise(type_, fields):
    envelope = p.read(json.dumps({**fields, "type": type_}))
    assert isinstance(envelope, p.Envelope)
    result = _PARSERS[type_](envelope)
    assert isinstance(result, (p.Refused, p.SessionUpdate, p.Append, p.TurnStart, p.Commit, p.TypedRequest,
                               p.FunctionOutput, p.Stop))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=64), st.binary(max_size=64)))
def test_no_frame_makes_read_raise(frame):
    assert isinstance(p.read(frame), (p.Envelope, p.Refused))


def test_the_parser_knows_exactly_the_types_the_v3_session_handles():
    from vllm_omni_voicechat.wire.v3.connection import _HANDLERS

    assert set(_HANDLERS) == p.TYPES == set(_PARSERS)


def test_an_id_beyond_64_bits_is_echoed_as_sent():
    # Client frames decode through orjson where it gives the json module's values; it reads a big integer as a
    # float, so such a frame is the json module's and its id stays an integer.
    big = 123456789012345678901234567890
    env = p.read(json.dumps({"type": "input_audio_buffer.append", "event_id": big, "audio": "AAAA"}))
    assert isinstance(env, p.Envelope) and env.event_id == big and type(env.event_id) is int
