"""A silent v3 client holds no slot for ever: no ``session.update`` within the configure timeout, or no client event
for the idle timeout while the model merely listens, ends the session (fatal error, ``session.closed``, close 1000).
Sans-I/O on the sync host with a virtual clock (exact events and times), then once on a real server."""

from __future__ import annotations

import base64
import json

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.shell.sync import SyncDriver
from vllm_omni_voicechat.sim.model import SimulatorModel
from vllm_omni_voicechat.synth.simulated import SimulatorSynthesizer
from vllm_omni_voicechat.wire.transport import CloseTransport, WireText
from vllm_omni_voicechat.wire.v3 import V3Options, V3Session

from .server_fixture import RawClient, running_app

UPDATE = {"type": "session.update", "event_id": "u", "session": {"protocol_version": 3, "instructions": "Hi."}}


class Host:
    def __init__(self, **options) -> None:
        self.session = V3Session(SessionCore(SessionConfig(session_id="S", settlement_blank_frames=3)),
                                 V3Options(**options))
        self.out: list = []
        self.host = SyncDriver(self.session, SimulatorModel(), synthesizer=SimulatorSynthesizer(),
                               on_event=self.out.append, keep=False, step_seconds=0.01)
        self.host.dispatch(self.session.start(self.clock.now))

    @property
    def clock(self):
        return self.host.clock

    def send(self, event: dict) -> None:
        self.host.dispatch(self.session.receive(json.dumps(event), self.clock.now))

    def run(self, **kw) -> None:
        self.host.run(max_positions=2000, **kw)

    def events(self) -> list[dict]:
        return [json.loads(o.text) for o in self.out if isinstance(o, WireText)]

    def ending(self) -> list:
        """The fatal error, session.closed and the close instruction."""
        events = self.events()
        fatal = next(i for i, e in enumerate(events) if e["type"] == "error" and e["error"]["fatal"])
        closes = [o for o in self.out if isinstance(o, CloseTransport)]
        return [(e["type"], e.get("error", {}).get("code") or e.get("reason")) for e in events[fatal:]] + [
            (c.code, c.reason) for c in closes]


def test_no_session_update_within_the_configure_timeout_ends_the_session_at_that_time():
    h = Host(configure_timeout_s=30.0)
    h.run()  # the clock jumps to the deadline: nothing else is due
    assert h.session.closed and h.clock.now == 30.0
    assert h.ending() == [("error", "session_configure_timeout"), ("session.closed", "session_configure_timeout"),
                          (1000, "session_configure_timeout")]
    error = next(e for e in h.events() if e["type"] == "error")["error"]
    assert error["message"] == "no session.update within 30 s of session.created" and error["fatal"] is True


def test_an_idle_session_whose_client_is_silent_ends_the_idle_timeout_after_its_last_event():
    h = Host(idle_timeout_s=5.0)
    h.send(UPDATE)
    h.run(stop_when=lambda: h.session.core.idle)
    h.clock.advance(1.0)
    h.send({"type": "input_audio_buffer.turn_start", "event_id": "s", "client_turn_id": 1})
    h.send({"type": "input_audio_buffer.append", "event_id": "a", "encoding": "pcm16", "sample_rate": 16000,
            "channels": 1, "audio": base64.b64encode(render_speech("hello")).decode()})
    last = h.clock.now
    h.send({"type": "input_audio_buffer.commit", "event_id": "c", "client_turn_id": 1})
    h.run(stop_when=lambda: h.session.core.idle)
    answered = h.clock.now
    assert [e["type"] for e in h.events()].count("response.done") == 1 and not h.session.closed
    h.run()  # idle now: only the silent client's deadline is left
    assert h.session.closed and h.clock.now == max(answered, last + 5.0)
    assert h.ending() == [("error", "session_idle_timeout"), ("session.closed", "session_idle_timeout"),
                          (1000, "session_idle_timeout")]


def test_a_client_streaming_silence_is_not_idle():
    h = Host(idle_timeout_s=2.0)
    h.send(UPDATE)
    h.run(stop_when=lambda: h.session.core.idle)
    silence = {"type": "input_audio_buffer.append", "encoding": "pcm16", "sample_rate": 16000, "channels": 1,
               "audio": base64.b64encode(bytes(INPUT_FRAME_BYTES)).decode()}
    for _ in range(100):  # 8 s of 80 ms appends, four idle timeouts' worth
        h.clock.advance(0.08)
        h.send(silence)
        h.run(stop_when=lambda: h.session.core.idle)
    assert not h.session.closed


def test_without_timeouts_a_silent_session_waits_for_nothing():
    h = Host(configure_timeout_s=None, idle_timeout_s=None)
    tick = h.session.poll(h.clock.now)
    assert tick.wake_at is None and tick.position is None
    h.run()
    assert not h.session.closed and h.clock.now == 0.0


def test_a_silent_v3_socket_is_closed_and_frees_its_slot():
    with running_app(ServerConfig(max_sessions=1, v3_configure_timeout_s=0.5)) as (url, _):
        c = RawClient(url + "/v1/voicechat")
        c.recv_type("session.created")  # and then never a word
        assert c.close_code() == 1000
        assert [(e["type"], e.get("error", {}).get("code") or e.get("reason")) for e in c.received[1:]] == [
            ("error", "session_configure_timeout"), ("session.closed", "session_configure_timeout")]
        assert c.close_reason == "session_configure_timeout"
        other = RawClient(url + "/v1/voicechat")
        assert other.recv()["type"] == "session.created"
        other.close()
