"""Nemotron VoiceChat serving: a sans-I/O runtime (80 ms model clock, voicechat session semantics),
a deterministic CPU simulator model, wire projectors and a vLLM-Omni adapter at the edge.

The names a user needs are importable from here; each is loaded on first use, so importing the package stays
cheap (vLLM's and vLLM-Omni's plugin loaders import it)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "SessionCore": "vllm_omni_voicechat.session.core",
    "SessionConfig": "vllm_omni_voicechat.session.core",
    "V3Session": "vllm_omni_voicechat.wire.v3.connection",
    "TieredSession": "vllm_omni_voicechat.wire.tiered.connection",
    "create_app": "vllm_omni_voicechat.server.app",
    "ServerConfig": "vllm_omni_voicechat.server.config",
    "V3Client": "vllm_omni_voicechat.client.v3",
    "SimulatorModel": "vllm_omni_voicechat.sim.model",
    "render_speech": "vllm_omni_voicechat.audio.speech",
    "decode_speech": "vllm_omni_voicechat.audio.speech",
}

__all__ = [
    "SessionConfig",
    "SessionCore",
    "ServerConfig",
    "SimulatorModel",
    "TieredSession",
    "V3Client",
    "V3Session",
    "__version__",
    "create_app",
    "decode_speech",
    "render_speech",
]

if TYPE_CHECKING:
    from .audio.speech import decode_speech, render_speech
    from .client.v3 import V3Client
    from .server.app import create_app
    from .server.config import ServerConfig
    from .session.core import SessionConfig, SessionCore
    from .sim.model import SimulatorModel
    from .wire.tiered.connection import TieredSession
    from .wire.v3.connection import V3Session


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
