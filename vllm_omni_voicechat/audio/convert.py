"""Streaming sample-format and rate conversion (pure; soxr streams keep their state across chunks).

:class:`PcmDecoder` turns client audio (``pcm16``, ``pcm_f32le``, ``g711_ulaw``, ``g711_alaw`` at any rate) into
16 kHz mono PCM16; :class:`PcmEncoder` turns the model's 22,050 Hz PCM16 into PCM16 or G.711 at any rate. Both take
canonical format names and validated rates: spellings and rate rules are a wire dialect's.
"""

from __future__ import annotations

import numpy as np
import soxr

from ..errors import VoicechatError
from .frames import INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE, zero_bytes
from .g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

__all__ = [
    "BYTES_PER_SAMPLE",
    "FORMATS",
    "G711_ALAW",
    "G711_ULAW",
    "PCM16",
    "PCM_F32LE",
    "AudioPayloadError",
    "PcmDecoder",
    "PcmEncoder",
]

PCM16 = "pcm16"
PCM_F32LE = "pcm_f32le"
G711_ULAW = "g711_ulaw"
G711_ALAW = "g711_alaw"
FORMATS: tuple[str, ...] = (PCM16, PCM_F32LE, G711_ULAW, G711_ALAW)
BYTES_PER_SAMPLE = {PCM16: 2, PCM_F32LE: 4, G711_ULAW: 1, G711_ALAW: 1}

_EMPTY_F32 = np.zeros(0, dtype=np.float32)


class AudioPayloadError(VoicechatError, ValueError):
    """A chunk that is not a whole number of samples of its format."""


def _new_stream(in_rate: int, out_rate: int) -> soxr.ResampleStream:
    # float32 rather than int16: soxr's int16 output rounding depends on the chunk boundaries (LSB
    # differences), float32 streams give the same samples whatever the chunking.
    return soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32")


def _resample(stream: soxr.ResampleStream, x: np.ndarray | None, last: bool = False) -> np.ndarray:
    """int16 samples through a float32 stream -> int16 samples (rounded, clipped)."""
    f = _EMPTY_F32 if x is None else np.multiply(x, np.float32(1.0 / 32768.0), dtype=np.float32)
    y = stream.resample_chunk(f, last=last)
    y = y * np.float32(32768.0)  # a new array: soxr's output is not ours to write
    np.rint(y, out=y)
    np.minimum(y, 32767.0, out=y)  # the ufuncs: np.clip's wrapper costs more than the clipping
    np.maximum(y, -32768.0, out=y)
    return y.astype(np.int16)


def _f32_to_i16(data: bytes) -> np.ndarray:
    """float32 samples -> int16: NaN -> 0, clipped to [-1, 1], scaled by 32767, rounded half to even."""
    f = np.frombuffer(data, dtype="<f4")
    # A float32 times 32767 is exact in float64 (24 + 15 bits), so clipping after scaling is clipping before.
    x = np.multiply(f, 32767.0, dtype=np.float64)
    if not np.isfinite(np.dot(f, f)):  # a NaN or an inf somewhere (or a sum too big for float32): rare
        np.copyto(x, 0.0, where=np.isnan(x))
    np.clip(x, -32767.0, 32767.0, out=x)
    np.rint(x, out=x)
    return x.astype(np.int16)


class PcmDecoder:
    """Audio in ``format`` at ``sample_rate`` -> 16 kHz mono PCM16 (little-endian) bytes, streaming.

    ``feed(chunk)`` returns what the resampler has ready (possibly ``b""``, notably for the first chunks);
    ``flush()`` drains it and leaves the decoder ready for a new stream; ``clear()`` drops the pending state.
    """

    def __init__(self, format: str = PCM16, sample_rate: int = INPUT_SAMPLE_RATE) -> None:
        self.format = format
        self.sample_rate = sample_rate
        self._width = BYTES_PER_SAMPLE[format]
        self._stream = None if sample_rate == INPUT_SAMPLE_RATE else _new_stream(sample_rate, INPUT_SAMPLE_RATE)

    def decode(self, chunk: bytes) -> np.ndarray:
        """Decode one chunk to int16 samples at the input rate (no resampling)."""
        data = bytes(chunk)
        if len(data) % self._width:
            raise AudioPayloadError(f"{self.format} audio needs a multiple of {self._width} bytes, got {len(data)}")
        if self.format == PCM16:
            return np.frombuffer(data, dtype="<i2").astype(np.int16)
        if self.format == PCM_F32LE:
            return _f32_to_i16(data)
        if self.format == G711_ULAW:
            return ulaw_decode(data)
        return alaw_decode(data)

    def feed(self, chunk: bytes) -> bytes:
        if self._stream is None and len(chunk) % self._width == 0:
            if self.format == PCM16:
                return bytes(chunk)  # already what the model takes
            if self.format == PCM_F32LE and chunk == zero_bytes(len(chunk)):  # silence: a memcmp, no float maths
                return zero_bytes(len(chunk) // 2)
        x = self.decode(chunk)
        if self._stream is None:
            return x.astype("<i2").tobytes()
        if not x.size:
            return b""
        return _resample(self._stream, x).astype("<i2").tobytes()

    def flush(self) -> bytes:
        if self._stream is None:
            return b""
        out = _resample(self._stream, None, last=True).astype("<i2").tobytes()
        self._stream.clear()
        return out

    def clear(self) -> None:
        if self._stream is not None:
            self._stream.clear()


class PcmEncoder:
    """The model's 22,050 Hz PCM16 -> ``format`` (``pcm16`` or G.711) at ``sample_rate``, streaming.

    ``feed(pcm16)`` returns the encoded audio ready so far (resampler output is uneven); ``flush()`` drains it and
    leaves the encoder ready for the next stream. An odd trailing byte is carried to the next chunk.
    """

    def __init__(self, format: str = PCM16, sample_rate: int = 24_000) -> None:
        self.format = format
        self.sample_rate = sample_rate
        self._carry = b""
        self._stream = None if sample_rate == OUTPUT_SAMPLE_RATE else _new_stream(OUTPUT_SAMPLE_RATE, sample_rate)

    @property
    def bytes_per_second(self) -> int:
        return self.sample_rate * (2 if self.format == PCM16 else 1)

    def _encode(self, x: np.ndarray) -> bytes:
        if self.format == PCM16:
            return x.astype("<i2", copy=False).tobytes()
        if self.format == G711_ULAW:
            return ulaw_encode(x)
        return alaw_encode(x)

    def feed(self, pcm16: bytes) -> bytes:
        data = self._carry + bytes(pcm16)
        if len(data) % 2:
            self._carry, data = data[-1:], data[:-1]
        else:
            self._carry = b""
        x = np.frombuffer(data, dtype="<i2")  # read only: resampling and encoding make new arrays
        if self._stream is not None:
            if not x.size:
                return b""
            x = _resample(self._stream, x)
        return self._encode(x)

    def flush(self) -> bytes:
        self._carry = b""
        if self._stream is None:
            return b""
        out = _resample(self._stream, None, last=True)
        self._stream.clear()
        return self._encode(out)

    def clear(self) -> None:
        self._carry = b""
        if self._stream is not None:
            self._stream.clear()
