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

Stage 1 (the talker) holds one request per session too, and it grows with every position: its speaker-prompt
prefill (``talker_init_len``), a timeline placeholder and a generated code step per position (vLLM's counters
showed about one generated token a position), and more when positions arrive faster than real time (a backlog, a
burst of appends). Measured on the real engine on CPU, on a quiet machine: with a Stage-1 ``max_model_len`` of
2,048 a burst-fed session stalled at 680 positions with no error (the talker's request had ended, Stage 2 sent no
more packets); with 8,192 the same session reached its 1,000-position guard. 2,048 / 680 is 3.0 tokens a
position, so the guard must also fit ``talker_init_len + TALKER_TOKENS_PER_POSITION x positions`` in Stage 1's
``max_model_len`` and ``TALKER_TOKENS_PER_POSITION x positions`` in its ``max_tokens`` (conservative: only the
generated steps count there).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import VoicechatError
from ..fleet.keys import check_replica_name
from ..runner.stage0 import DEFAULT_MAX_SESSION_MODEL_FRAMES
from ..session.settlement import DEFAULT_FENCE
from ..wire.tiered.routing import BARE_DEFAULTS

MIN_PROMPT_TOKENS = 1024
"""Prompt tokens (instructions + tool block, with BOS/EOS) a deployment must leave room for in Stage 0."""

TALKER_TOKENS_PER_POSITION = 3
"""Stage-1 request tokens one position may cost (the worst measured on the CPU engine: 2,048 tokens / 680
positions = 3.0; see the module docstring)."""

# name -> (type, minimum); ServerConfig fields plus the port's own knobs
FIELDS: Mapping[str, tuple[type, float | None]] = {
    "warmup_positions": (int, 0),
    "max_session_model_frames": (int, 1),
    "settlement_blank_frames": (int, 1),
    "settlement_await_s": (float, 0.0),
    "function_call_timeout_s": (float, 0.001),
    "function_recovery_max_frames": (int, 1),
    "journal_max_bytes": (int, 1),
    "journal_ttl_s": (float, 0.001),
    "disconnect_grace_s": (float, 0.0),
    "admission_queue": (int, 0),
    "admission_timeout_s": (float, 0.001),
    "handshake_timeout_s": (float, 0.001),
    "default_instructions": (str, None),
    "realtime_default": (str, None),
    "v3_turns": (str, None),
    "audio_lag_positions": (int, 0),
    "step_timeout_s": (float, 0.001),
    "tick_slot_ms": (float, 0.0),
    "replica": (str, None),
    "agent_port": (int, 1),
    "agent_host": (str, None),
}

ENVIRONMENT = {"VOICECHAT_REPLICA": "replica", "VOICECHAT_AGENT_PORT": "agent_port",
               "VOICECHAT_AGENT_HOST": "agent_host"}
"""A replica's identity, per process (one deploy YAML serves every GPU's replica; deploy/haproxy/README.md)."""


MAX_TICK_SLOT_MS = 40.0
"""``voicechat.tick_slot_ms`` (the engine tick, ``runner/tick.py``): at most half a frame."""

V3_TURNS = ("client", "legacy")
"""``voicechat.v3_turns``: client-owned v3 turns (production) or the diagnostic RNNT-owned legacy mode."""


class VoicechatSettingsError(VoicechatError, ValueError):
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
    lag, fence = out.get("audio_lag_positions", 0), out.get("settlement_blank_frames", DEFAULT_FENCE)
    if lag >= fence:  # a held response end must be released before the next response can start (alignment.py)
        raise VoicechatSettingsError(f"voicechat.audio_lag_positions ({lag}) must be below "
                                     f"voicechat.settlement_blank_frames ({fence})")
    if out.get("realtime_default", "v3") not in BARE_DEFAULTS:
        raise VoicechatSettingsError(f"voicechat.realtime_default must be one of {', '.join(BARE_DEFAULTS)}")
    if out.get("tick_slot_ms", 0.0) > MAX_TICK_SLOT_MS:
        raise VoicechatSettingsError(f"voicechat.tick_slot_ms must be at most half a frame ({MAX_TICK_SLOT_MS:g}), "
                                     f"not {out['tick_slot_ms']!r}")
    if out.get("v3_turns", "client") not in V3_TURNS:
        raise VoicechatSettingsError(f"voicechat.v3_turns must be one of {', '.join(V3_TURNS)}")
    if "replica" in out:
        try:
            check_replica_name(out["replica"])
        except ValueError as exc:
            raise VoicechatSettingsError(f"voicechat.replica: {exc}") from None
    return out


def environment_settings(environ: Mapping[str, str]) -> dict[str, Any]:
    """``VOICECHAT_REPLICA`` / ``VOICECHAT_AGENT_PORT`` / ``VOICECHAT_AGENT_HOST``, validated as the block's keys
    (they take precedence over it)."""
    block: dict[str, Any] = {}
    for variable, name in ENVIRONMENT.items():
        value = environ.get(variable)
        if value:
            if FIELDS[name][0] is int:
                try:
                    block[name] = int(value)
                except ValueError:
                    raise VoicechatSettingsError(f"{variable} must be an integer, not {value!r}") from None
            else:
                block[name] = value
    return parse_block(block)


def _stage(deploy: Mapping[str, Any], stage_id: int) -> Mapping[str, Any] | None:
    for stage in deploy.get("stages") or ():
        if isinstance(stage, Mapping) and stage.get("stage_id") == stage_id:
            return stage
    return None


def _engine_arg(stage: Mapping[str, Any] | None, key: str) -> Any:
    if stage is None:
        return None
    return stage.get(key, (stage.get("engine_args") or {}).get(key))


def stage0_max_model_len(deploy: Mapping[str, Any]) -> int | None:
    """Stage 0's ``max_model_len`` in a resolved deploy YAML (None when it does not say)."""
    value = _engine_arg(_stage(deploy, 0), "max_model_len")
    return int(value) if value is not None else None


def talker_lengths(deploy: Mapping[str, Any]) -> tuple[int | None, int | None, int]:
    """Stage 1's ``(max_model_len, default max_tokens, talker_init_len)`` in a resolved deploy YAML (None where it
    does not say; ``talker_init_len`` 0 when absent)."""
    stage = _stage(deploy, 1)
    max_model_len = _engine_arg(stage, "max_model_len")
    sampling = (stage or {}).get("default_sampling_params") or {}
    max_tokens = sampling.get("max_tokens")
    overrides = _engine_arg(stage, "hf_overrides") or {}
    init = int(overrides.get("talker_init_len", 0) or 0)
    return (int(max_model_len) if max_model_len is not None else None,
            int(max_tokens) if max_tokens is not None else None, init)


def check_talker_length(max_session_model_frames: int, max_model_len: int | None, max_tokens: int | None,
                        talker_init_len: int = 0) -> None:
    """Raise unless a full-length session fits Stage 1's request (see the module docstring)."""
    need = TALKER_TOKENS_PER_POSITION * max_session_model_frames
    if max_model_len is not None and talker_init_len + need > max_model_len:
        raise VoicechatSettingsError(
            f"voicechat.max_session_model_frames={max_session_model_frames} needs {talker_init_len + need} tokens "
            f"in Stage 1's request ({talker_init_len} + {TALKER_TOKENS_PER_POSITION} per position) but its "
            f"max_model_len is {max_model_len}: lower it to at most "
            f"{(max_model_len - talker_init_len) // TALKER_TOKENS_PER_POSITION} or raise Stage 1's max_model_len")
    if max_tokens is not None and need > max_tokens:
        raise VoicechatSettingsError(
            f"voicechat.max_session_model_frames={max_session_model_frames} needs {need} generated tokens in "
            f"Stage 1 ({TALKER_TOKENS_PER_POSITION} per position) but its max_tokens is {max_tokens}: lower it to "
            f"at most {max_tokens // TALKER_TOKENS_PER_POSITION} or raise Stage 1's max_tokens")


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


def check_concurrency(deploy: Mapping[str, Any]) -> None:
    """Raise unless every admitted session can stream at once: vLLM-Omni's bounded active-stream window
    (``active_stream_window``, the chunk transfer adapter's K) lets only K requests of Stages 1-2 stream, so a
    session beyond K got no audio until an earlier one ended (measured on the CPU engine: a second session's first
    position waited 10-13 s, the length of the first session). Each stage's ``max_num_seqs`` bounds it too."""
    sessions = (deploy.get("duplex_session") or {}).get("max_sessions")
    if not sessions:
        return
    window = int(deploy.get("active_stream_window", 0) or 0)
    if 0 < window < sessions:
        raise VoicechatSettingsError(
            f"active_stream_window={window} lets only {window} session(s) stream through Stages 1-2 at once but "
            f"duplex_session.max_sessions is {sessions}: the others would get no audio until one ends; set it to "
            f">= {sessions} (or 0, unbounded)")
    for stage in deploy.get("stages") or ():
        seqs = _engine_arg(stage, "max_num_seqs") if isinstance(stage, Mapping) else None
        if seqs is not None and int(seqs) < sessions:
            raise VoicechatSettingsError(
                f"stage {stage.get('stage_id')} has max_num_seqs={seqs} but duplex_session.max_sessions is "
                f"{sessions}: raise it to >= {sessions}")


def check_schedulers(deploy: Mapping[str, Any]) -> None:
    """Raise when a stage asks for async scheduling: our stage schedulers (``scheduler.py``, named by our pipeline)
    extend vLLM-Omni's synchronous ones, so the stage would silently lose it."""
    for stage in deploy.get("stages") or ():
        if isinstance(stage, Mapping) and _engine_arg(stage, "async_scheduling") is True:
            raise VoicechatSettingsError(
                f"stage {stage.get('stage_id')} sets async_scheduling: true, but our stage schedulers extend "
                "vLLM-Omni's synchronous ones (the engine tick and the batch log): set it to false")


def read_settings(config_path: str | Path | None) -> dict[str, Any]:
    """The validated block of the deploy YAML the engine was started with (``{}`` without one), its session position
    guard checked against Stage 0's and Stage 1's request lengths (see the module docstring) and its sessions against
    the stages' concurrency."""
    if config_path is None:
        return {}
    from vllm_omni.config.stage_config import resolve_deploy_yaml

    deploy = resolve_deploy_yaml(config_path)
    out = parse_block(deploy.get("voicechat"))
    frames = out.get("max_session_model_frames", DEFAULT_MAX_SESSION_MODEL_FRAMES)
    max_model_len = stage0_max_model_len(deploy)
    if max_model_len is not None:
        prompt_token_budget(frames, max_model_len)
    check_talker_length(frames, *talker_lengths(deploy))
    check_concurrency(deploy)
    check_schedulers(deploy)
    return out
