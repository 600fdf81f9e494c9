"""One wire base: both dialects' protocol objects drive their core through ``WireSession``'s forwarding, and each
offers the whole driving interface the hosts use."""

from __future__ import annotations

import pytest

from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.shell.driving import WireDriven
from vllm_omni_voicechat.wire.session import WireSession
from vllm_omni_voicechat.wire.tiered.connection import TieredSession
from vllm_omni_voicechat.wire.v3.connection import V3Session

FORWARDED = ("fail", "prefilled", "prefill_failed", "synthesis_done", "synthesis_failed", "poisoned", "disconnect",
             "refusal_id")


@pytest.mark.parametrize("cls, policy", [(V3Session, "client"), (TieredSession, "model")])
def test_each_dialect_is_a_wire_session_with_the_whole_driving_interface(cls, policy):
    session = cls(SessionCore(SessionConfig(turn_policy=policy)))
    assert isinstance(session, WireSession) and isinstance(session, WireDriven)
    for name in FORWARDED:
        assert name not in vars(cls), f"{cls.__name__}.{name} repeats the base's forwarding"
    assert session.session_id == session.core.session_id


def test_a_completion_goes_to_the_core_and_comes_back_projected():
    core = SessionCore(SessionConfig(turn_policy="client"))
    session = V3Session(core)
    out = session.poisoned("the previous session's cleanup failed", 0.0)
    assert core.closed and session.closed
    texts = [o.json() for o in out if hasattr(o, "json")]
    assert texts[0]["type"] == "error" and texts[0]["error"]["code"] == "model_cleanup_failed"
    assert session.disconnect(1.0) == []  # closed already: nothing more


def test_each_dialect_hands_an_append_on_with_when_the_host_read_it():
    """The audio of an append is ready from when the host read it (it may hand it over only after the position in
    flight): both dialects carry ``arrived`` to the position (its lateness counts from then; it is paced from when it
    was handed over)."""
    import base64
    import json

    from vllm_omni_voicechat.shell.sync import SyncDriver
    from vllm_omni_voicechat.sim.model import SimulatorModel
    from vllm_omni_voicechat.synth.simulated import SimulatorSynthesizer

    from .helpers import LOUD_NOISE_FRAME
    from .tiered_harness import TieredDriver

    def append(event_id: str, **v3_fields: object) -> str:
        return json.dumps({"type": "input_audio_buffer.append", "event_id": event_id,
                           "audio": base64.b64encode(LOUD_NOISE_FRAME).decode(), **v3_fields})

    v3 = V3Session(SessionCore(SessionConfig(session_id="S", settlement_blank_frames=3)))
    host = SyncDriver(v3, SimulatorModel(), synthesizer=SimulatorSynthesizer(), step_seconds=0.01)
    host.dispatch(v3.start(host.clock.now))
    for event in ({"type": "session.update", "event_id": "u", "session": {"protocol_version": 3}},
                  {"type": "input_audio_buffer.turn_start", "event_id": "t", "client_turn_id": 1}):
        host.dispatch(v3.receive(json.dumps(event), host.clock.now))
        host.run(max_positions=50, advance_time=False)
    host.clock.advance(1.0)
    pcm16 = {"encoding": "pcm16", "sample_rate": 16000, "channels": 1}
    host.dispatch(v3.receive(append("a1", **pcm16), host.clock.now, arrived=host.clock.now - 0.05))
    position = v3.poll(host.clock.now).position
    assert position is not None and position.arrived == pytest.approx(host.clock.now - 0.05)
    assert position.due == host.clock.now  # paced from when it was handed over

    tiered = TieredDriver()
    tiered.send({"type": "session.update", "session": {"instructions": "Be brief."}})
    tiered.run()
    tiered.clock.advance(1.0)
    now = tiered.clock.now
    tiered.driver.dispatch(tiered.session.receive(append("a1"), now, arrived=now - 0.05))
    position = tiered.session.poll(now).position
    assert position is not None and position.arrived == pytest.approx(now - 0.05) and position.due == now
