"""Server configuration."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..model.port import ModelPort
from ..runner.stage0 import DEFAULT_MAX_SESSION_MODEL_FRAMES
from ..session.settlement import DEFAULT_FENCE
from ..sim.model import SimBehaviour, SimulatorModel
from ..synth.port import Synthesizer
from ..synth.simulated import SimulatorSynthesizer


@dataclass(slots=True)
class ServerConfig:
    max_sessions: int = 4
    max_session_model_frames: int = DEFAULT_MAX_SESSION_MODEL_FRAMES
    settlement_blank_frames: int = DEFAULT_FENCE
    default_instructions: str = ""
    function_call_timeout_s: float = 30.0
    function_recovery_max_frames: int = 256
    model_kind: str = "simulator"
    model_factory: Callable[[], ModelPort] = field(default=lambda: SimulatorModel())
    synthesizer: Synthesizer | None = field(default_factory=SimulatorSynthesizer)
    realtime_default: str = "v3"
    """What a bare ``/v1/realtime`` (no ``duplex``/``model`` query, no ``OpenAI-Beta``) speaks: v3 | tiered |
    tiered-openai."""
    disconnect_grace_s: float = 30.0
    """How long a detached tiered session waits for ``session.resume``."""
    handshake_timeout_s: float = 10.0
    """How long a tiered socket without autostart may wait before its first message (then config_timeout)."""
    warmup_positions: int = 0
    """Silent positions of a throwaway session run before the server admits clients (0: none). A failing warmup
    fails the startup: a model home that cannot run positions should not accept sessions. The simulator needs
    none; real model homes do (first-position compilation and allocation)."""
    journal_max_bytes: int = 8 << 20
    journal_ttl_s: float = 60.0

    @classmethod
    def simulator(cls, *, prefill_delay_s: float = 0.05, behaviour: SimBehaviour | None = None, **kw) -> ServerConfig:
        """The embedded CPU default: the simulator model with a measurable prefill (the model-ready barrier)."""
        base = behaviour or SimBehaviour()
        if prefill_delay_s and not base.prefill_delay_s:
            base = replace(base, prefill_delay_s=prefill_delay_s)
        return cls(model_kind="simulator", model_factory=lambda: SimulatorModel(base), **kw)
