"""The ``voicechat:`` block of our deploy YAML: our runtime's bounds for a ``vllm-omni serve`` deployment.

vLLM-Omni's loader ignores unknown top-level keys, so the block lives beside ``duplex_session`` (whose
``max_sessions`` stays the one admission bound). Validated here so a typo fails the startup, not a session.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..wire.tiered.routing import BARE_DEFAULTS

# name -> (type, minimum); ServerConfig fields plus the port's own knobs
FIELDS: Mapping[str, tuple[type, float | None]] = {
    "warmup_positions": (int, 0),
    "max_session_model_frames": (int, 1),
    "settlement_blank_frames": (int, 1),
    "function_call_timeout_s": (float, 0.001),
    "function_recovery_max_frames": (int, 1),
    "journal_max_bytes": (int, 1),
    "journal_ttl_s": (float, 0.001),
    "disconnect_grace_s": (float, 0.0),
    "handshake_timeout_s": (float, 0.001),
    "default_instructions": (str, None),
    "realtime_default": (str, None),
    "audio_lag_positions": (int, 0),
    "step_timeout_s": (float, 0.001),
}


class VoicechatSettingsError(ValueError):
    pass


def parse_block(block: Any) -> dict[str, Any]:
    if block is None:
        return {}
    if not isinstance(block, Mapping):
        raise VoicechatSettingsError("voicechat: must be a mapping")
    unknown = sorted(set(block) - set(FIELDS))
    if unknown:
        raise VoicechatSettingsError(f"voicechat: unknown keys {unknown}; known: {sorted(FIELDS)}")
    out: dict[str, Any] = {}
    for name, value in block.items():
        kind, minimum = FIELDS[name]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise VoicechatSettingsError(f"voicechat.{name} must be {kind.__name__}, not {value!r}")
        if minimum is not None and value < minimum:
            raise VoicechatSettingsError(f"voicechat.{name} must be >= {minimum}, not {value!r}")
        out[name] = value
    if out.get("realtime_default", "v3") not in BARE_DEFAULTS:
        raise VoicechatSettingsError(f"voicechat.realtime_default must be one of {', '.join(BARE_DEFAULTS)}")
    return out


def read_settings(config_path: str | Path | None) -> dict[str, Any]:
    """The validated block of the deploy YAML the engine was started with (``{}`` without one)."""
    if config_path is None:
        return {}
    from vllm_omni.config.stage_config import resolve_deploy_yaml

    return parse_block(resolve_deploy_yaml(config_path).get("voicechat"))
