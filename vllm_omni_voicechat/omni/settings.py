"""The ``voicechat:`` block of our deploy YAML: our runtime's bounds for a ``vllm-omni serve`` deployment.

vLLM-Omni's loader ignores unknown top-level keys, so the block lives beside ``duplex_session`` (whose
``max_sessions`` stays the one admission bound). Validated here so a typo fails the startup, not a session.

Session length. One Stage-0 request holds ``prompt + 1 + positions`` tokens (the prompt, the frame-0 slot, one
sampled token per later position; vLLM-Omni's ``plan_append`` enforces it per epoch), so the runtime's position
guard (``max_session_model_frames``, counted over the whole session, epochs included) is consistent with Stage 0
when ``max_session_model_frames + prompt + 1 <= max_model_len``. The check below keeps at least
``MIN_PROMPT_TOKENS`` for the prompt: the guard then ends a session with the clean ``session_position_limit``
error before Stage 0 could refuse a position. A prompt longer than what is left fails at its first position
beyond the bound with vLLM-Omni's own ``max_model_len`` error (a model error of that session, never a crash).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..runner.stage0 import DEFAULT_MAX_SESSION_MODEL_FRAMES
from ..wire.tiered.routing import BARE_DEFAULTS

MIN_PROMPT_TOKENS = 1024
"""Prompt tokens (instructions + tool block, with BOS/EOS) a deployment must leave room for in Stage 0."""

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


def stage0_max_model_len(deploy: Mapping[str, Any]) -> int | None:
    """Stage 0's ``max_model_len`` in a resolved deploy YAML (None when it does not say)."""
    for stage in deploy.get("stages") or ():
        if isinstance(stage, Mapping) and stage.get("stage_id") == 0:
            value = stage.get("max_model_len", (stage.get("engine_args") or {}).get("max_model_len"))
            return int(value) if value is not None else None
    return None


def prompt_token_budget(max_session_model_frames: int, max_model_len: int,
                        min_prompt_tokens: int = MIN_PROMPT_TOKENS) -> int:
    """The prompt tokens Stage 0 leaves after a full-length session; raises when below ``min_prompt_tokens``."""
    budget = max_model_len - 1 - max_session_model_frames
    if budget < min_prompt_tokens:
        raise VoicechatSettingsError(
            f"voicechat.max_session_model_frames={max_session_model_frames} leaves {budget} prompt tokens in Stage "
            f"0's max_model_len={max_model_len} (need >= {min_prompt_tokens}): lower it to at most "
            f"{max_model_len - 1 - min_prompt_tokens} or raise Stage 0's max_model_len")
    return budget


def read_settings(config_path: str | Path | None) -> dict[str, Any]:
    """The validated block of the deploy YAML the engine was started with (``{}`` without one), checked against
    Stage 0's ``max_model_len`` (the session position guard, see the module docstring)."""
    if config_path is None:
        return {}
    from vllm_omni.config.stage_config import resolve_deploy_yaml

    deploy = resolve_deploy_yaml(config_path)
    out = parse_block(deploy.get("voicechat"))
    max_model_len = stage0_max_model_len(deploy)
    if max_model_len is not None:
        prompt_token_budget(out.get("max_session_model_frames", DEFAULT_MAX_SESSION_MODEL_FRAMES), max_model_len)
    return out
