"""The one WAV reader and writer: any PCM 8/16/24/32-bit or IEEE float 32/64-bit file in, PCM16 mono out.

The stdlib ``wave`` module reads neither float nor WAVE_FORMAT_EXTENSIBLE files, so chunks are parsed here.
"""

from __future__ import annotations

import struct
import wave
from pathlib import Path

import numpy as np

from .frames import INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE

__all__ = ["load_wav_16k", "read_wav", "to_pcm16_16k", "write_wav"]

_WAVE_PCM, _WAVE_FLOAT, _WAVE_EXTENSIBLE = 1, 3, 0xFFFE


def _read(path: str | Path) -> tuple[np.ndarray, int, int, int]:
    """(samples (frames, channels) in [-1, 1], rate, format tag, bits per sample)."""
    data = Path(path).read_bytes()
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError(f"{path}: not a RIFF/WAVE file")
    fmt: tuple[int, int, int, int] | None = None
    pcm: bytes | None = None
    offset = 12
    while offset + 8 <= len(data):
        chunk_id, size = data[offset : offset + 4], struct.unpack_from("<I", data, offset + 4)[0]
        body = data[offset + 8 : offset + 8 + size]
        if chunk_id == b"fmt ":
            tag, channels, rate = struct.unpack_from("<HHI", body, 0)
            bits = struct.unpack_from("<H", body, 14)[0]
            if tag == _WAVE_EXTENSIBLE and len(body) >= 26:
                tag = struct.unpack_from("<H", body, 24)[0]  # the sub-format GUID starts with the real tag
            fmt = (tag, channels, rate, bits)
        elif chunk_id == b"data":
            pcm = body
        offset += 8 + size + (size & 1)  # chunks are word-aligned
    if fmt is None or pcm is None:
        raise ValueError(f"{path}: no fmt or data chunk")
    tag, channels, rate, bits = fmt
    width = bits // 8
    if channels < 1 or width < 1:
        raise ValueError(f"{path}: bad format ({channels} channels, {bits} bits)")
    pcm = pcm[: len(pcm) - len(pcm) % (width * channels)]
    if tag == _WAVE_FLOAT and bits in (32, 64):
        samples = np.frombuffer(pcm, dtype=f"<f{width}").astype(np.float32)
    elif tag == _WAVE_PCM and bits == 8:
        samples = (np.frombuffer(pcm, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif tag == _WAVE_PCM and bits in (16, 32):
        samples = np.frombuffer(pcm, dtype=f"<i{width}").astype(np.float32) / float(2 ** (bits - 1))
    elif tag == _WAVE_PCM and bits == 24:
        raw = np.frombuffer(pcm, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        value = raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)
        samples = (np.where(value >= 1 << 23, value - (1 << 24), value) / float(1 << 23)).astype(np.float32)
    else:
        raise ValueError(f"{path}: unsupported WAV encoding (format {tag}, {bits} bits)")
    return samples.reshape(-1, channels), rate, tag, bits


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """A WAV file as float32 samples in [-1, 1], shape (frames, channels), and its sample rate.

    PCM 8/16/24/32-bit and IEEE float 32/64-bit, plain or WAVE_FORMAT_EXTENSIBLE.
    """
    samples, rate, _, _ = _read(path)
    return samples, rate


def to_pcm16_16k(samples: np.ndarray, rate: int) -> bytes:
    """Mix down to mono, resample to 16 kHz (soxr) and quantize to little-endian PCM16."""
    mono = samples.mean(axis=1) if samples.ndim == 2 else samples
    if rate != INPUT_SAMPLE_RATE:
        import soxr

        mono = soxr.resample(mono.astype(np.float32), rate, INPUT_SAMPLE_RATE)
    # Scale by 2**15 (the inverse of read_wav's PCM16 scaling), so 16 kHz mono PCM16 passes through bit-exact.
    return np.clip(np.round(mono * 32768.0), -32768, 32767).astype("<i2").tobytes()


def load_wav_16k(path: str | Path, *, pcm16_only: bool = False) -> bytes:
    """A WAV file as 16 kHz mono PCM16 (unchanged when it already is); ``pcm16_only`` refuses any other
    encoding."""
    samples, rate, tag, bits = _read(path)
    if pcm16_only and (tag, bits) != (_WAVE_PCM, 16):
        raise ValueError(f"{path}: only 16-bit PCM WAV is supported (sample width {bits // 8})")
    return to_pcm16_16k(samples, rate)


def write_wav(path: str | Path, pcm16: bytes, rate: int = OUTPUT_SAMPLE_RATE) -> None:
    """Mono PCM16 to a WAV file (parent folders are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm16)
