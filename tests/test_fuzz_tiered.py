"""Protocol fuzzing of the tiered dialect, in-process (docs/reliability.md, "Fuzzing").

Seed-fixed generated client streams for both lanes (valid, invalid and hostile events, model behaviours) with
socket drops, resumes (right, stale, future and bogus cursors or tokens), takeovers by a second socket and grace
expiry, against ``TieredSession`` over the simulator. Each socket's stream and the client's de-duplicated view
across sockets go through the trace checker (``server_event_seq`` +1 per socket from the resume cursor, and +1
across sockets in the client's view: nothing lost, every duplicate dropped by seq).
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.session.events import Prefill
from vllm_omni_voicechat.sim.model import SimBehaviour
from vllm_omni_voicechat.wire.tiered.connection import TieredOptions, TieredSession
from vllm_omni_voicechat.wire.transport import WireText

from .fuzz import TOOLS_TIERED, FuzzStats, fuzz
from .tiered_harness import TieredDriver, types


def assert_clean(stats: FuzzStats) -> None:
    assert stats.ok, json.dumps(stats.summary(), indent=1)[:6000]


@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_generated_tiered_streams_keep_every_invariant(seed):
    stats = fuzz("tiered", seed=seed, events=250)
    assert_clean(stats)
    assert stats.client_events >= 250


def test_tiered_fuzz_covers_resume_and_rejections():
    stats = fuzz("tiered", seed=20261130, events=2000)
    assert_clean(stats)
    for key in ("drops", "resumes", "takeovers", "resume_refused", "duplicate_dropped"):
        assert stats.transport[key] > 0, (key, stats.transport)
    seen = set(stats.errors_by_code)
    for code in ("invalid_json", "bad_event", "unknown_event", "bad_audio", "unsupported_session_resume",
                 "invalid_event_ack"):
        assert code in seen, (code, sorted(seen))
    assert stats.usability_checks > 0


def test_a_call_staged_on_the_eou_position_surfaces_on_the_tiered_lane():
    """Found by benchmarks/fuzz.py (tiered seed 0, episode 129): the session counted itself idle while the model
    held a staged SOTC (deferred BOS), so no position ran to publish the call and the client waited forever."""
    d = TieredDriver(behaviour=SimBehaviour(sotc_on_eou=True), settlement_blank_frames=3)
    d.send({"type": "session.update", "session": {"tools": TOOLS_TIERED}})
    d.run()
    d.append(render_speech("hello there") + bytes(2 * INPUT_FRAME_BYTES))
    d.run()
    d.send({"type": "input_audio_buffer.commit"})
    d.run()
    after = types(d.events)
    assert "input_audio_buffer.committed" in after
    # (the client never answers: the fatal deferred-BOS timeout follows, by design)
    tail = after[after.index("input_audio_buffer.committed"):after.index("response.done") + 1]
    assert "error" not in tail
    assert tail.index("response.created") < tail.index("response.function_call_arguments.done") < tail.index(
        "response.done")


# ------------------------------------------------------------------ regressions of bugs the fuzzer found (fixed)


def _tiered(**options) -> TieredSession:
    core = SessionCore(SessionConfig(session_id="duplex-S", turn_policy="model", gate_open_after=1))
    return TieredSession(core, TieredOptions(**options))


def _wire(outputs: list) -> list[dict]:
    return [o.json() for o in outputs if isinstance(o, WireText)]


def test_events_raised_during_the_first_prefill_follow_session_created():
    s = _tiered()
    out = s.receive(json.dumps({"type": "session.update", "session": {}}), 0.0)
    assert _wire(out) == [] and any(isinstance(o, Prefill) for o in out)
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    assert _wire(s.receive(json.dumps({"type": "conversation.item.create", "item": item}), 0.0)) == []
    assert _wire(s.receive(json.dumps({"type": "session.heartbeat"}), 0.0)) == []
    events = _wire(s.prefilled(0.1))
    assert [e["type"] for e in events] == ["session.created", "session.updated", "conversation.item.added",
                                          "conversation.item.created", "conversation.item.done",
                                          "session.heartbeat_ack"]
    assert [e.get("server_event_seq") for e in events] == [None, 1, 2, 3, 4, 5]


def test_an_error_at_journal_overflow_is_still_sent():
    s = _tiered()
    s.receive(json.dumps({"type": "session.update", "session": {}}), 0.0)
    s.prefilled(0.0)
    s.journal.max_bytes = s.journal.retained_bytes + 300  # room for about two errors: the third overflows
    seqs, notices = [], 0
    for i in range(6):
        for e in _wire(s.receive(json.dumps({"type": "nope", "event_id": f"x{i}"}), 0.0)):
            if e["type"] == "session.resync_required":
                notices += 1
            else:
                assert e["error"]["event_id"] == f"x{i}"
                seqs.append(e["server_event_seq"])
    assert notices == 1 and len(seqs) == 6 and seqs == list(range(seqs[0], seqs[0] + 6))


def test_an_echoed_lone_surrogate_goes_out_as_utf8_text():
    s = _tiered()
    s.receive(json.dumps({"type": "session.update", "session": {}}), 0.0)
    s.prefilled(0.0)
    (out,) = [o for o in s.receive('{"type": "\\ud800", "event_id": "\\udfff"}', 0.0) if isinstance(o, WireText)]
    out.text.encode("utf-8")  # sendable
    assert out.json()["error"]["event_id"] == "\udfff"
