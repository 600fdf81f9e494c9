"""``input_audio_buffer.append`` validation, in the contract's order."""

from __future__ import annotations

import binascii
from typing import Any

import pybase64

from ...audio.frames import INPUT_SAMPLE_RATE
from ...errors import VoicechatError
from .schema import MAX_APPEND_BYTES


class AudioRejected(VoicechatError, ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _exactly(value: Any, expected: int) -> bool:
    return type(value) is int and value == expected  # a JSON int, never a bool (nor any other subclass)


def decode_append(msg: dict[str, Any]) -> bytes:
    """Validated PCM16 bytes of an append, or :class:`AudioRejected` with the first failing check's code."""
    if msg.get("encoding") != "pcm16":
        raise AudioRejected("unsupported_audio_encoding", f"encoding must be 'pcm16', not {msg.get('encoding')!r}")
    if not _exactly(msg.get("sample_rate"), INPUT_SAMPLE_RATE):
        raise AudioRejected("unsupported_sample_rate", f"sample_rate must be 16000, not {msg.get('sample_rate')!r}")
    if not _exactly(msg.get("channels"), 1):
        raise AudioRejected("unsupported_channel_count", f"channels must be 1, not {msg.get('channels')!r}")
    audio = msg.get("audio")
    if audio is None or audio == "":
        raise AudioRejected("empty_audio", "audio is missing or empty")
    if not isinstance(audio, str):
        raise AudioRejected("invalid_audio", "audio must be a base64 string")
    # The transport bounds the message size (uvicorn's ws_max_size), so decoding before the size check is safe
    # and keeps the contract's order: invalid_audio before audio_packet_too_large.
    try:
        pcm = pybase64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AudioRejected("invalid_audio", f"audio is not strict base64: {exc}") from None
    if len(pcm) % 2:
        raise AudioRejected("invalid_audio", "audio must hold whole 16-bit samples (even byte count)")
    if len(pcm) > MAX_APPEND_BYTES:
        raise AudioRejected("audio_packet_too_large", f"at most {MAX_APPEND_BYTES} decoded bytes per append")
    return pcm
