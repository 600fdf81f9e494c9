"""Fixed facts of the tiered dialect: capabilities, close codes and lease defaults (docs/tiered-dialect.md §1.3)."""

from __future__ import annotations

from typing import Any

CLOSE_NORMAL = 1000
CLOSE_PROTOCOL = 1002
CLOSE_INTERNAL = 1011
CLOSE_TRY_AGAIN_LATER = 1013

DISCONNECT_GRACE_S = 30.0
HANDSHAKE_TIMEOUT_S = 10.0
MAX_PENDING_INPUT_BYTES = 16 << 20


def close_code_for(fatal_code: str) -> int:
    return CLOSE_NORMAL if fatal_code == "session_position_limit" else CLOSE_INTERNAL


def capabilities(
    *,
    lane: str,
    typed_input: bool,
    max_sessions: int,
    function_call_timeout_s: float,
    max_function_calls: int,
    admission_queue: int = 0,
) -> dict[str, Any]:
    """What is true for this runtime (0.30's key set, plus a few keys clients ignore when unknown)."""
    return {
        "implementation_level": "model_native_duplex",
        "supports_model_native_turn_policy": True,
        "chunk_period_ms": 80,
        "signal_sources": ["model_native", "client_event", "server_policy"],
        "supports_external_turn_signal": True,
        "input_modes": ["append_audio_chunk"],
        "supports_input_append": True,
        "supports_client_commit": True,
        "required_input_modalities": ["audio"],
        "optional_input_modalities": ["video"],
        "supports_barge_in": True,
        "supports_audio_truncate": True,
        "supports_playback_ack": True,
        "supports_session_resume": lane == "full",
        "supports_input_receipt": lane == "full",  # session.resumed.input_received (§6.5)
        "supports_session_lease": True,
        "supports_multi_session": max_sessions > 1,
        "session_admission_mode": "server_managed",
        "supports_admission_queue": admission_queue > 0,
        "admission_queue_max": admission_queue,
        "supports_text_only_turn": typed_input,
        "supports_rollback_to_checkpoint": False,
        "supports_reencode_context": False,
        "target_barge_in_latency_ms": None,
        "supports_function_calls": True,
        "max_function_calls_per_turn": max_function_calls,
        "function_call_timeout_s": function_call_timeout_s,
        "supports_typed_input": typed_input,
        "output_sample_rate_hz": 22_050,
    }
