"""The OpenAI lane's per-response overrides that this model cannot honour (docs/tiered-dialect.md §3.4): a pure
check of a ``response.create`` against the session's settings."""

from __future__ import annotations

from . import parser as p
from .projector import Refused
from .settings import SessionSettings


def unservable_response_options(e: p.ResponseCreate, s: SessionSettings) -> Refused | None:
    """OpenAI lane: per-response overrides this model cannot honour (the parser already refuses
    instructions, voice, temperature, tools, tool_choice and max_*tokens). An override equal to the session's
    value is no override; ``metadata`` is accepted and not echoed (docs/tiered-dialect.md §3.4)."""
    r = e.response or {}
    unsupported = "unsupported_native_response_options"
    if r.get("conversation") not in (None, "auto"):
        return Refused(unsupported, "out-of-band responses (conversation other than 'auto') are not supported: "
                       "the model answers in the one conversation", "response.conversation")
    for key in ("input", "prompt"):
        if r.get(key) is not None:
            return Refused(unsupported, f"response.{key} is not supported: the model answers the conversation "
                           "it has heard", f"response.{key}")
    for key in ("output_modalities", "modalities"):
        value = r.get(key)
        if value is not None and (not isinstance(value, list) or set(value) != set(s.output_modalities)):
            return Refused(unsupported, f"response.{key} must equal the session's output_modalities "
                           f"{list(s.output_modalities)}; change them with session.update", f"response.{key}")
    if e.output_format is not None and (
            e.output_format != s.output_format
            or e.output_sample_rate_hz is not None and e.output_sample_rate_hz != s.output_rate):
        return Refused(unsupported, "a per-response output audio format is not supported; change it with "
                       "session.update", "response.audio.output.format")
    audio = r.get("audio")
    output = audio.get("output") if isinstance(audio, dict) else None
    voice = output.get("voice") if isinstance(output, dict) else None
    if voice is not None and voice != s.voice:
        return Refused(unsupported, "a per-response voice is not supported", "response.audio.output.voice")
    return None
