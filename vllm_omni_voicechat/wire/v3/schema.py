"""v3 constants: protocol object, capabilities, session description and close codes."""

from __future__ import annotations

from typing import Any

from ...audio.frames import FRAME_MS, INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE

PROTOCOL_NAME = "voicechat.realtime"
PROTOCOL_VERSION = 3
PROTOCOL = {"name": PROTOCOL_NAME, "version": PROTOCOL_VERSION}
MODEL_OUTPUT_MODE = "client_authored_v1"
V3_TURN_POLICY = {"client": "client", "legacy": "model"}
"""Who owns v3 turns in the contract's words (``client``, its diagnostic RNNT-owned ``legacy``) -> the session's turn
policy."""

MAX_APPEND_BYTES = 40_960
RECEIVE_QUEUE_MESSAGES = 256  # the reference server's receive queue: frames beyond it are refused
CONFIGURE_TIMEOUT_S = 30.0  # no session.update by then: the session ends (a socket that never speaks holds no slot)
IDLE_TIMEOUT_S = 300.0  # no client event while idle for this long: the session ends (the tiered idle TTL's default)

CLOSE_NORMAL = 1000
CLOSE_PROTOCOL = 1002
CLOSE_INTERNAL = 1011
CLOSE_BUSY = 1013

_PROTOCOL_VIOLATIONS = frozenset(
    {
        "unsupported_protocol_version",
        "invalid_event_id",
        "invalid_client_turn_id",
        "input_turn_conflict",
        "deferred_input_overflow",
    }
)


SERVER_LIMITS = frozenset({"session_position_limit", "session_configure_timeout", "session_idle_timeout"})
"""Fatal codes of a limit the server sets on a session (not a failure): ``session.closed`` follows, then close 1000."""


def close_code_for(fatal_code: str) -> int:
    """The WebSocket close code that follows a fatal error with this code."""
    if fatal_code in SERVER_LIMITS:
        return CLOSE_NORMAL
    if fatal_code == "server_busy":
        return CLOSE_BUSY
    if fatal_code in _PROTOCOL_VIOLATIONS:
        return CLOSE_PROTOCOL
    return CLOSE_INTERNAL


def capabilities(
    *,
    typed_input: bool,
    max_session_model_frames: int,
    single_client: bool,
    model_turns: bool = False,
    function_call_timeout_s: float = 30.0,
    function_recovery_max_frames: int = 256,
) -> dict[str, Any]:
    return {
        "server_turn_detection": "rnnt" if model_turns else None,
        "input_turn_detection": "server_rnnt" if model_turns else "client_smart_turn_v1",
        "input_transcription": True,
        "function_calling": True,
        "typed_input": typed_input,
        "settings_mutable_until": "first_model_input_frame",
        "single_client": single_client,
        "function_call_timeout_seconds": float(function_call_timeout_s),
        "function_output_max_bytes": 16384,
        "function_output_max_tokens": 128,
        "function_output_recovery_max_frames": function_recovery_max_frames,
        "function_output_ack_timeout_seconds": 30.0,
        "max_function_calls_per_response": 8,
        "function_event_emit_timeout_seconds": 5.0,
        "max_session_model_frames": max_session_model_frames,
        "binary_audio": False,
        "function_output_model_output": {"mode": MODEL_OUTPUT_MODE},
    }


def audio_formats() -> dict[str, Any]:
    return {
        "input_audio_format": "pcm16",
        "input_audio_sample_rate": INPUT_SAMPLE_RATE,
        "output_audio_format": "pcm16",
        "output_audio_sample_rate": OUTPUT_SAMPLE_RATE,
    }


def created_session(session_id: str, checkpoint: dict[str, Any]) -> dict[str, Any]:
    return {"id": session_id, **audio_formats(), "frame_duration_ms": FRAME_MS, "checkpoint": checkpoint}
