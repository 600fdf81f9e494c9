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
