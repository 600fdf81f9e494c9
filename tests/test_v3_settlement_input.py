"""Quiet audio a v3 client sends after its commit feeds the settlement instead of zeros (contract section 7,
"queued microphone audio"), on the synchronous host: the frames the receive pump holds behind the commit go on to the
settlement in order; anything else at the head of the pump (speech, a malformed frame, another event) stops that and
waits for the commit's effects, answered in its place."""

from __future__ import annotations

import base64
import json

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.shell.sync import SyncDriver
from vllm_omni_voicechat.sim.model import SimBehaviour, SimulatorModel
from vllm_omni_voicechat.synth.simulated import SimulatorSynthesizer
from vllm_omni_voicechat.wire.transport import CloseTransport
from vllm_omni_voicechat.wire.v3 import V3Options, V3Session

from .helpers import BatchedModel

LOUD = bytes([0x00, 0x40] * (INPUT_FRAME_BYTES // 2))
QUIET = bytes([0x10, 0x00] * (INPUT_FRAME_BYTES // 2))  # about -66 dBFS: below the gate


def append(pcm: bytes, event_id: str, audio: str | None = None) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "event_id": event_id, "encoding": "pcm16",
                       "sample_rate": 16000, "channels": 1,
                       "audio": audio if audio is not None else base64.b64encode(pcm).decode()})


def barrier(kind: str, event_id: str, k: int = 1) -> str:
    return json.dumps({"type": f"input_audio_buffer.{kind}", "event_id": event_id, "client_turn_id": k})


def committed_with(after_commit: list[str]) -> list[dict]:
    """A configured session; one loud frame in turn 1, the commit, then ``after_commit`` while the commit's barrier
    is unfinished (held by the pump); every event the client got."""
    session = V3Session(SessionCore(SessionConfig(settlement_blank_frames=3)), V3Options())
    out: list = []
    host = SyncDriver(session, SimulatorModel(SimBehaviour(tail_positions=0)), synthesizer=SimulatorSynthesizer(),
                      on_event=out.append, keep=False)
    host.dispatch(session.start(0.0))
    host.dispatch(session.receive(json.dumps({"type": "session.update", "event_id": "u",
                                              "session": {"protocol_version": 3}}), 0.0))
    host.run(stop_when=lambda: session.core.configured)
    for message in (barrier("turn_start", "s1"), append(LOUD, "a0"), barrier("commit", "c1"), *after_commit):
        host.dispatch(session.receive(message, 0.0))
    assert session.held_messages == 2 + len(after_commit)  # all behind the turn start's barrier, then the commit's
    host.run(stop_when=lambda: session.core.idle and not session.held_messages)
    return [json.loads(o.text) for o in out if not isinstance(o, CloseTransport)]


def positions(events: list[dict]) -> list[tuple]:
    return [(e["turn_state"]["kind"], e["transport_frame"], e["input_audio"],
             e["turn_state"].get("settlement_input_source"))
            for e in events if e["type"] == "voicechat.metrics" and e["frame"] is not None]


def test_quiet_frames_held_behind_the_commit_feed_its_settlement():
    events = committed_with([append(QUIET, "q1"), append(QUIET, "q2")])
    assert positions(events)[:4] == [
        ("real", 0, True, None),
        ("settlement", 1, True, "queued_microphone_audio"),
        ("settlement", 2, True, "queued_microphone_audio"),
        ("settlement", None, False, "zero"),  # the fence position: BOS on the third, as with zeros
    ]
    assert [p for p in positions(events) if p[0] == "real"] == [("real", 0, True, None)]  # none left over
    types = [e["type"] for e in events]
    assert types.index("input_audio_buffer.committed") < types.index("response.created")


def test_speech_a_malformed_frame_or_another_event_stops_the_feed_and_waits_for_the_commit():
    for stopper, answered, later in (
        (append(LOUD, "x"), False, [2, 3]),  # speech (frame 2), then the quiet frame 3 behind it
        (append(b"", "x", audio="!!"), True, [2]),
        (json.dumps({"type": "response.create", "event_id": "x"}), True, [2]),
    ):
        events = committed_with([append(QUIET, "q1"), stopper, append(QUIET, "q2")])
        view = positions(events)
        assert view[:4] == [
            ("real", 0, True, None),
            ("settlement", 1, True, "queued_microphone_audio"),
            ("settlement", None, False, "zero"),
            ("settlement", None, False, "zero"),
        ], stopper
        types = [e["type"] for e in events]
        if answered:  # in its place: after the commit's effects
            answer = next(i for i, e in enumerate(events) if e["type"] == "error"
                          and e["error"].get("client_event_id") == "x")
            assert types.index("input_audio_buffer.committed") < answer
        # what it held back runs after the response starts, in order
        assert [p[1] for p in view[4:] if p[0] == "real"] == later


def test_a_settlement_waiting_for_the_next_frame_takes_it_from_the_pump():
    """With ``settlement_await_s``, on a model home that batches the session with others, the settlement's first
    position waits for the frame the streaming client sends next (20 ms after its commit here); the pump holds it
    behind the commit and hands it on when it comes."""
    session = V3Session(SessionCore(SessionConfig(settlement_blank_frames=3, settlement_await_s=0.04)), V3Options())
    out: list = []
    host = SyncDriver(session, BatchedModel(), synthesizer=SimulatorSynthesizer(), on_event=out.append, keep=False,
                      step_seconds=0.01)
    host.dispatch(session.start(host.clock.now))
    host.dispatch(session.receive(json.dumps({"type": "session.update", "event_id": "u",
                                              "session": {"protocol_version": 3}}), host.clock.now))
    host.run(stop_when=lambda: session.core.configured)
    t0 = host.clock.now
    for message in (barrier("turn_start", "s1"), append(LOUD, "a0")):
        host.dispatch(session.receive(message, host.clock.now))
    host.run(advance_time=False)
    host.clock.advance(t0 + 0.06 - host.clock.now)
    host.dispatch(session.receive(barrier("commit", "c1"), host.clock.now))
    host.run(advance_time=False)
    events = [json.loads(o.text) for o in out if not isinstance(o, CloseTransport)]
    assert [p[0] for p in positions(events)] == ["real"]  # the settlement waits for the next frame
    host.clock.advance(0.02)
    host.dispatch(session.receive(append(QUIET, "q1"), host.clock.now))
    host.run(stop_when=lambda: session.core.idle and not session.held_messages)
    events = [json.loads(o.text) for o in out if not isinstance(o, CloseTransport)]
    assert positions(events)[:4] == [
        ("real", 0, True, None),
        ("settlement", 1, True, "queued_microphone_audio"),
        ("settlement", None, False, "zero"),
        ("settlement", None, False, "zero"),
    ]
    types = [e["type"] for e in events]
    assert types.index("input_audio_buffer.committed") < types.index("response.created")
