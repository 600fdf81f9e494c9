"""Shared test helpers: a simulator session on a virtual clock and compact views of native events."""

from __future__ import annotations

import dataclasses
from dataclasses import fields

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.model.port import SessionPrompt, ToolSpec
from vllm_omni_voicechat.session.commands import Configure
from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.session.events import AudioDelta, NativeEvent, PositionMetrics
from vllm_omni_voicechat.shell.sync import SyncDriver
from vllm_omni_voicechat.sim.model import SimBehaviour, SimulatorModel
from vllm_omni_voicechat.synth.simulated import SimulatorSynthesizer

SID = "S"
T = lambda k: f"turn_{SID}_{k}"  # noqa: E731
R = lambda k: f"response_{SID}_{k}"  # noqa: E731
LOUD_NOISE_FRAME = bytes([0x00, 0x40] * (INPUT_FRAME_BYTES // 2))  # constant 0x4000: far above the gate
SILENCE_FRAME = bytes(INPUT_FRAME_BYTES)


def session(
    *,
    behaviour: SimBehaviour | None = None,
    tools: tuple[ToolSpec, ...] = (),
    configure: bool = True,
    synthesizer=SimulatorSynthesizer(),
    **config,
) -> SyncDriver:
    config.setdefault("session_id", SID)
    core = SessionCore(SessionConfig(**config))
    driver = SyncDriver(core, SimulatorModel(behaviour), synthesizer=synthesizer, step_seconds=0.01)
    if configure:
        driver.send(Configure(SessionPrompt("Be brief.", tools)))
    return driver


class BatchedModel:
    """The simulator, reporting every position as run together with three other sessions' (an engine's tick)."""

    def __init__(self, batched_with: int = 4) -> None:
        self.inner = SimulatorModel()
        self.batched_with = batched_with

    def step(self, position):
        result = self.inner.step(position)
        return dataclasses.replace(result, timings=dataclasses.replace(result.timings,
                                                                       batched_with=self.batched_with))

    def __getattr__(self, name):
        return getattr(self.inner, name)


def view(event: NativeEvent) -> tuple:
    """(TypeName, field values...) without metrics' timing fields; audio as its byte length."""
    name = type(event).__name__
    if isinstance(event, AudioDelta):
        return (name, event.turn_id, event.response_id, len(event.pcm))
    if isinstance(event, PositionMetrics):
        return (name, event.frame, event.transport_frame, event.kind)
    return (name, *(getattr(event, f.name) for f in fields(event)))


def protocol(events: list[NativeEvent]) -> list[tuple]:
    """Events without metrics and audio deltas, as compact tuples."""
    return [view(e) for e in events if not isinstance(e, (PositionMetrics, AudioDelta))]


def names(events: list[NativeEvent]) -> list[str]:
    return [type(e).__name__ for e in events if not isinstance(e, (PositionMetrics, AudioDelta))]


def metrics(events: list[NativeEvent], kind: str | None = None) -> list[PositionMetrics]:
    return [e for e in events if isinstance(e, PositionMetrics) and (kind is None or e.kind == kind)]


def audio(events: list[NativeEvent]) -> bytes:
    return b"".join(e.pcm for e in events if isinstance(e, AudioDelta))
