"""The v3 receive pump as a state machine (hypothesis, the synchronous host): frames written in one burst behind a
``session.update`` whose prefill is still running are answered in arrival order, none before ``session.updated``,
nothing after a fatal error but the close, and every frame is answered once the session is drained."""

from __future__ import annotations

import base64
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.shell.sync import SyncDriver
from vllm_omni_voicechat.sim.model import SimBehaviour, SimulatorModel
from vllm_omni_voicechat.synth.simulated import SimulatorSynthesizer
from vllm_omni_voicechat.wire.transport import CloseTransport
from vllm_omni_voicechat.wire.v3 import V3Options, V3Session

UPDATE = {"type": "session.update", "event_id": "u0",
          "session": {"protocol_version": 3, "tools": [{"name": "get_time", "description": "The time."}]}}


def _append(i: int, audio: str) -> dict:
    return {"type": "input_audio_buffer.append", "event_id": f"e{i}", "encoding": "pcm16", "sample_rate": 16000,
            "channels": 1, "audio": audio}


SILENT = base64.b64encode(bytes(INPUT_FRAME_BYTES)).decode()


def frame(kind: str, i: int, turn: int) -> str | bytes:
    """One client frame; the answer it must get is keyed by its event id ``e<i>`` (appends: none)."""
    eid = f"e{i}"
    match kind:
        case "json":
            return "{not json"
        case "binary":
            return b"\x00\x01"
        case "unsupported":
            return json.dumps({"type": "response.create", "event_id": eid})
        case "bad_append":
            return json.dumps(_append(i, "!!"))
        case "append":
            return json.dumps(_append(i, SILENT))
        case "start":
            return json.dumps({"type": "input_audio_buffer.turn_start", "event_id": eid, "client_turn_id": turn})
        case "commit":
            return json.dumps({"type": "input_audio_buffer.commit", "event_id": eid, "client_turn_id": turn})
        case "result":
            return json.dumps({"type": "conversation.item.create", "event_id": eid,
                               "item": {"type": "function_call_output", "call_id": "call_x", "output": "ok"}})
        case "update":
            return json.dumps({**UPDATE, "event_id": eid})
    raise AssertionError(kind)


ANSWERED_BY = {  # kind -> the event type that answers it (its client_event_id is the frame's event id)
    "unsupported": "error", "bad_append": "error", "result": "error", "update": "session.updated",
    "start": "input_audio_buffer.turn_started", "commit": "input_audio_buffer.committed",
}
KINDS = ["json", "binary", "unsupported", "bad_append", "append", "start", "commit", "result", "update"]


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(KINDS), max_size=24), st.booleans())
def test_a_burst_behind_a_prefill_is_answered_in_arrival_order(kinds: list[str], stop: bool):
    session = V3Session(SessionCore(SessionConfig(settlement_blank_frames=3)), V3Options())
    model = SimulatorModel(SimBehaviour(tail_positions=0))
    out: list = []
    host = SyncDriver(session, model, synthesizer=SimulatorSynthesizer(), on_event=out.append, defer_effects=True,
                      keep=False)
    host.dispatch(session.start(0.0))
    host.dispatch(session.receive(json.dumps(UPDATE), 0.0))
    turn, open_turn, expected = 0, False, []
    for i, kind in enumerate(kinds):
        if kind == "start":  # a well-behaved client: one turn at a time (conflicts are tested elsewhere)
            if open_turn:
                kind = "commit"
            else:
                turn += 1
        elif kind == "commit" and not open_turn:
            kind = "append"
        open_turn = (open_turn or kind == "start") and kind != "commit"
        host.dispatch(session.receive(frame(kind, i, turn), 0.0))
        expected.append((i, kind))
    if stop:
        host.dispatch(session.receive(json.dumps({"type": "session.stop", "event_id": "stop"}), 0.0))
    # the prefill is still running: nothing but the greeting went out, every frame waits in order
    texts = [json.loads(o.text) for o in out if not isinstance(o, CloseTransport)]
    assert [e["type"] for e in texts] == ["session.created"]
    assert session.held_messages == len(kinds) + stop
    host.run(max_positions=5000, stop_when=lambda: session.core.idle)  # not on to the silent client's deadline
    assert session.held_messages == 0
    events = [json.loads(o.text) for o in out if not isinstance(o, CloseTransport)]
    types = [e["type"] for e in events]
    assert types[1] == "session.updated"
    # every frame with an answer got exactly that answer, in arrival order (metrics are no answers; an update's
    # ack carries no echo, and a later update after a turn start is settings_locked instead)
    answers = []
    for e in events[2:]:
        if e["type"] == "error" and e["error"].get("client_event_id") is not None:
            answers.append(("error", e["error"]["client_event_id"]))
        elif e["type"] == "session.updated":
            answers.append(("session.updated", None))
        elif e["type"] in ("input_audio_buffer.turn_started", "input_audio_buffer.committed"):
            answers.append((e["type"], e["client_event_id"]))
    want = []
    for i, k in expected:
        if k == "update":
            want.append(("error", f"e{i}") if _after_start(expected, i) else ("session.updated", None))
        elif k in ANSWERED_BY:
            want.append((ANSWERED_BY[k], f"e{i}"))
    assert answers == want
    # the unechoed frames (malformed JSON, binary) still got their recoverable error, each in its place
    unechoed = [e["error"]["code"] for e in events if e["type"] == "error" and e["error"].get("client_event_id")
                is None]
    assert unechoed == [{"json": "invalid_json", "binary": "binary_audio_unsupported"}[k]
                        for _, k in expected if k in ("json", "binary")]
    assert not [e for e in events if e["type"] == "error" and e["error"]["fatal"]]
    if stop:
        assert types[-1] == "session.closed" and isinstance(out[-1], CloseTransport)
        assert (out[-1].code, out[-1].reason) == (1000, "client_stop")


def _after_start(expected: list[tuple[int, str]], index: int) -> bool:
    return any(k == "start" for i, k in expected if i < index)
