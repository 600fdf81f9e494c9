"""A tiered session on the simulator and a virtual clock, driven synchronously; wire events as dicts."""

from __future__ import annotations

import base64
import json
from typing import Any

from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.shell.sync import SyncDriver
from vllm_omni_voicechat.sim.model import SimBehaviour, SimulatorModel
from vllm_omni_voicechat.synth.simulated import SimulatorSynthesizer
from vllm_omni_voicechat.wire.tiered.connection import TieredOptions, TieredSession
from vllm_omni_voicechat.wire.transport import CloseTransport, WireText

SID = "S"


def tiered_core_config(**config: Any) -> SessionConfig:
    config.setdefault("session_id", SID)
    config.setdefault("turn_policy", "model")
    config.setdefault("gate_open_after", 1)
    return SessionConfig(**config)


class TieredDriver:
    def __init__(self, *, behaviour: SimBehaviour | None = None, options: TieredOptions | None = None,
                 defer_effects: bool = False, **config: Any):
        """``defer_effects``: prefills and syntheses wait for ``driver.complete_pending()`` (a slow prefill)."""
        self.session = TieredSession(SessionCore(tiered_core_config(**config)), options or TieredOptions())
        self.driver = SyncDriver(self.session, SimulatorModel(behaviour), synthesizer=SimulatorSynthesizer(),
                                 step_seconds=0.01, defer_effects=defer_effects)
        self.clock = self.driver.clock
        self._seen = 0
        self.driver.dispatch(self.session.start(self.clock.now))

    @property
    def outputs(self) -> list[Any]:
        return [o for o in self.driver.events if isinstance(o, (WireText, CloseTransport))]

    @property
    def events(self) -> list[dict]:
        return [o.json() for o in self.driver.events if isinstance(o, WireText)]

    def new_events(self) -> list[dict]:
        events = self.events
        out, self._seen = events[self._seen:], len(events)
        return out

    def send(self, event: dict | str) -> list[dict]:
        text = event if isinstance(event, str) else json.dumps(event)
        self.driver.dispatch(self.session.receive(text, self.clock.now))
        return self.new_events()

    def run(self, max_positions: int = 100_000) -> list[dict]:
        """Run positions until the session is idle (lease deadlines of an idle session are not waited for)."""
        self.driver.run(max_positions=max_positions, stop_when=lambda: self.session.core.idle)
        return self.new_events()

    def advance(self, seconds: float) -> list[dict]:
        """Let time pass with nothing running (lease deadlines fire)."""
        self.clock.advance(seconds)
        tick = self.session.poll(self.clock.now)
        self.driver.dispatch(tick.outputs)
        return self.new_events()

    def append(self, pcm: bytes, **extra: Any) -> list[dict]:
        return self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode(), **extra})


def types(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]
