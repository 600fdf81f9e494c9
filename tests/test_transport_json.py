"""``server_json`` (orjson, for the per-position events made only of the server's values) gives the same JSON as
``compact_json``, and what orjson refuses still goes out."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.wire import transport
from vllm_omni_voicechat.wire.transport import compact_json, server_json

REFERENCE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text() | st.floats(
    allow_nan=False, allow_infinity=False)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner,
                                                                                             max_size=4), max_leaves=20)


def test_orjson_is_the_fast_path_here():
    assert transport._orjson_dumps is not None  # a dependency: without it the json path gives the same text


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(st.dictionaries(st.text(), values, max_size=6))
def test_the_text_is_compact_utf8_json_of_the_same_event(event):
    text = server_json(event)
    text.encode("utf-8")  # sendable: a lone surrogate stays escaped on either path
    assert json.loads(text) == event  # the same value (orjson writes 1e-05 as 0.00001: same float)
    assert text == REFERENCE(event) or any(isinstance(v, float) for v in _leaves(event))  # floats may differ


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def test_what_orjson_refuses_goes_the_json_way():
    assert server_json({"id": 2**70}) == '{"id":1180591620717411303424}'  # beyond 64 bits
    assert server_json({1: "a"}) == '{"1":"a"}'  # a non-string key
    assert server_json({"echo": "\ud800x"}) == '{"echo":"\\ud800x"}'  # a lone surrogate stays escaped
    assert server_json({"text": "héllo ✓"}) == compact_json({"text": "héllo ✓"}) == '{"text":"héllo ✓"}'


def test_a_client_nan_is_echoed_as_sent_by_compact_json():
    assert compact_json({"job_id": float("nan")}) == '{"job_id":NaN}'  # why echoes never take the fast path


# ---------------------------------------------------------------------------------------------------- client frames

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | st.floats(),  # integers of any size, NaN, infinities
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4), max_leaves=20)


def _decoded(decode, text):
    try:
        return ("value", decode(text))
    except (ValueError, RecursionError) as exc:
        return ("error", type(exc), str(exc))


def _same(a, b):
    return repr(a) == repr(b)  # NaN != NaN, and 1 == 1.0: the repr tells both apart


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(json_values)
def test_a_client_frame_decodes_as_the_json_module_decodes_it(value):
    text = json.dumps(value)
    assert _same(_decoded(transport.client_json, text), _decoded(json.loads, text))


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(st.text(alphabet='{}[]",:0123456789.eE-+ \\u\tabfnrtlsNaIiy', max_size=30))
def test_a_malformed_frame_raises_what_the_json_module_raises(text):
    assert _same(_decoded(transport.client_json, text), _decoded(json.loads, text))


def test_a_flat_object_is_orjsons_and_the_rest_is_the_decoders():
    calls = []

    def decode(text):
        calls.append(text)
        return json.loads(text)

    append = '{"type":"input_audio_buffer.append","event_id":"e1","audio":"AAAA","n":7,"b":true,"z":null}'
    assert transport.client_json(append, decode) == json.loads(append)
    assert calls == []  # the fast path: every frame of a session
    for text in ('{"id":123456789012345678901234567890}',  # orjson would give a float
                 '{"x":1e400}', '{"x":NaN}', '{"x":"\\ud800"}',  # orjson refuses these
                 '{"x":1.5}', '{"x":[1]}', '[1,2]', '"s"'):
        assert _same(transport.client_json(text, decode), json.loads(text))
    assert len(calls) == 8
    assert transport.client_json('{"id":123456789012345678901234567890}')["id"] == 123456789012345678901234567890
