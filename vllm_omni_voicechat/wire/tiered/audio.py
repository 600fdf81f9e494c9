"""Audio formats and rates of the tiered dialect (docs/tiered-dialect.md §8): pure, no sockets.

* :func:`resolve_format` folds the beta (flat string) and GA (``{"type": "audio/pcm", "rate": 24000}``)
  spellings of an audio format into a canonical name and an optional rate.
* :func:`input_sample_rate` / :func:`output_sample_rate` apply the §8.1 / §8.2 rate precedence.
* :class:`InputConverter` turns client audio (``pcm16``, ``pcm_f32le``, ``g711_ulaw``, ``g711_alaw`` at any rate
  in 8,000-192,000 Hz) into 16 kHz mono PCM16, the core's ``AppendAudio`` contract, streaming through a
  ``soxr.ResampleStream`` that keeps its state across chunks (``flush()`` on commit, ``clear()`` on clear).
* :class:`OutputEncoder` turns the model's 22,050 Hz PCM16 into the session's output rate and format
  (default ``pcm16`` at 24,000 Hz; G.711 defaults to 8,000 Hz), streaming, with ``flush()`` at every terminal.

G.711 (ITU-T G.711 mu-law and A-law) is decoded with 256-entry numpy tables and encoded with vectorised numpy
(the stdlib ``audioop`` is gone in Python 3.13).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import soxr

__all__ = [
    "CORE_SAMPLE_RATE",
    "DEFAULT_INPUT_RATES",
    "DEFAULT_OUTPUT_RATE",
    "FORMATS",
    "G711_DEFAULT_RATE",
    "INPUT_FORMATS",
    "MAX_SAMPLE_RATE",
    "MIN_SAMPLE_RATE",
    "MODEL_SAMPLE_RATE",
    "OUTPUT_FORMATS",
    "AudioFormatError",
    "InputConverter",
    "OutputEncoder",
    "alaw_decode",
    "alaw_encode",
    "check_sample_rate",
    "input_sample_rate",
    "output_sample_rate",
    "resolve_format",
    "ulaw_decode",
    "ulaw_encode",
]

CORE_SAMPLE_RATE = 16_000  # the core's AppendAudio contract: PCM16 mono 16 kHz
MODEL_SAMPLE_RATE = 22_050  # the model's output: PCM16 mono 22,050 Hz
DEFAULT_OUTPUT_RATE = 24_000
G711_DEFAULT_RATE = 8_000
MIN_SAMPLE_RATE = 8_000
MAX_SAMPLE_RATE = 192_000
#: default pcm input rate per lane (§1.2)
DEFAULT_INPUT_RATES: Mapping[str, int] = {"full": 16_000, "openai": 24_000}

PCM16 = "pcm16"
PCM_F32LE = "pcm_f32le"
G711_ULAW = "g711_ulaw"
G711_ALAW = "g711_alaw"

FORMATS: tuple[str, ...] = (PCM16, PCM_F32LE, G711_ULAW, G711_ALAW)
INPUT_FORMATS = frozenset(FORMATS)
OUTPUT_FORMATS = frozenset({PCM16, G711_ULAW, G711_ALAW})

_ALIASES: dict[str, str] = {}
for _canon, _names in {
    PCM16: ("pcm16", "pcm_s16le", "s16le", "pcm", "audio/pcm"),
    PCM_F32LE: ("pcm_f32le", "f32le", "audio/pcm_f32le"),
    G711_ULAW: ("g711_ulaw", "audio/pcmu", "ulaw", "mulaw", "g711-ulaw", "audio/g711_ulaw"),
    G711_ALAW: ("g711_alaw", "audio/pcma", "alaw", "g711-alaw", "audio/g711_alaw"),
}.items():
    for _n in _names:
        _ALIASES[_n] = _canon
del _canon, _names, _n

_BYTES_PER_SAMPLE = {PCM16: 2, PCM_F32LE: 4, G711_ULAW: 1, G711_ALAW: 1}


class AudioFormatError(ValueError):
    """A bad audio format, rate or payload. ``code`` is the wire error code to answer with."""

    def __init__(self, message: str, code: str = "unsupported_audio_format", param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


# --- format and rate resolution ------------------------------------------------------------------------


def check_sample_rate(rate: Any, param: str = "sample_rate_hz") -> int:
    """Validate a sample rate: an integer in [8,000, 192,000] (an integral float is accepted)."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)):
        raise AudioFormatError(f"{param} must be an integer, got {rate!r}", "invalid_sample_rate", param)
    if isinstance(rate, float):
        if not rate.is_integer():
            raise AudioFormatError(f"{param} must be an integer, got {rate!r}", "invalid_sample_rate", param)
        rate = int(rate)
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise AudioFormatError(
            f"{param} must be in [{MIN_SAMPLE_RATE}, {MAX_SAMPLE_RATE}], got {rate}", "invalid_sample_rate", param
        )
    return int(rate)


def resolve_format(value: Any, *, output: bool = False, param: str = "format") -> tuple[str, int | None]:
    """Canonical format name and the rate carried by the spelling (GA ``rate``), else ``None``.

    ``value`` is a flat string (``"pcm16"``, ``"g711_ulaw"``, ``"audio/pcmu"``, ...; case-insensitive) or a
    GA format object ``{"type": "audio/pcm", "rate": 24000}``. ``output=True`` rejects formats that cannot be
    produced (``pcm_f32le``; ``wav`` is unsupported everywhere). Raises :class:`AudioFormatError`.
    """
    rate: int | None = None
    if isinstance(value, Mapping):
        name = value.get("type")
        if "rate" in value and value["rate"] is not None:
            rate = check_sample_rate(value["rate"], f"{param}.rate")
        param = f"{param}.type"
    else:
        name = value
    if not isinstance(name, str):
        raise AudioFormatError(f"{param} must be a string, got {name!r}", param=param)
    canon = _ALIASES.get(name.strip().lower())
    allowed = OUTPUT_FORMATS if output else INPUT_FORMATS
    if canon is None or canon not in allowed:
        kind = "output" if output else "input"
        raise AudioFormatError(
            f"unsupported {kind} audio format {name!r}; use one of {', '.join(f for f in FORMATS if f in allowed)}",
            param=param,
        )
    return canon, rate


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _first_rate(candidates: list[tuple[Any, str]]) -> int | None:
    for value, param in candidates:
        if value is not None:
            return check_sample_rate(value, param)
    return None


def input_sample_rate(
    append: Mapping[str, Any] | None = None,
    session: Mapping[str, Any] | None = None,
    *,
    lane: str = "full",
    format: str | None = None,
) -> int:
    """The input rate per §8.1, first found wins: the append's ``sample_rate_hz`` | ``sample_rate`` | format
    ``rate``; the session's ``sample_rate_hz`` | ``sample_rate`` | ``audio.input.sample_rate_hz`` |
    ``audio.input.format.rate``; the default (8,000 for G.711 ``format``, else the lane's: 16 k full, 24 k
    OpenAI)."""
    a = append or {}
    s = session or {}
    rate = _first_rate(
        [
            (a.get("sample_rate_hz"), "sample_rate_hz"),
            (a.get("sample_rate"), "sample_rate"),
            (_get(a, "format", "rate"), "format.rate"),
            (s.get("sample_rate_hz"), "session.sample_rate_hz"),
            (s.get("sample_rate"), "session.sample_rate"),
            (_get(s, "audio", "input", "sample_rate_hz"), "session.audio.input.sample_rate_hz"),
            (_get(s, "audio", "input", "format", "rate"), "session.audio.input.format.rate"),
        ]
    )
    if rate is not None:
        return rate
    if format is not None and resolve_format(format)[0] in (G711_ULAW, G711_ALAW):
        return G711_DEFAULT_RATE
    try:
        return DEFAULT_INPUT_RATES[lane]
    except KeyError:
        raise ValueError(f"lane must be one of {', '.join(DEFAULT_INPUT_RATES)}, got {lane!r}") from None


def output_sample_rate(session: Mapping[str, Any] | None = None, *, format: str | None = None) -> int:
    """The output rate per §8.2: ``audio.output.format.rate``, else ``audio.output.sample_rate_hz`` |
    ``sample_rate``, else 24,000 (8,000 for a G.711 ``format``)."""
    s = session or {}
    rate = _first_rate(
        [
            (_get(s, "audio", "output", "format", "rate"), "session.audio.output.format.rate"),
            (_get(s, "audio", "output", "sample_rate_hz"), "session.audio.output.sample_rate_hz"),
            (s.get("sample_rate"), "session.sample_rate"),
        ]
    )
    if rate is not None:
        return rate
    if format is not None and resolve_format(format, output=True)[0] in (G711_ULAW, G711_ALAW):
        return G711_DEFAULT_RATE
    return DEFAULT_OUTPUT_RATE


# --- G.711 ---------------------------------------------------------------------------------------------


def _ulaw_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    mag = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    out = np.where(u & 0x80, 0x84 - mag, mag - 0x84).astype(np.int16)
    out.setflags(write=False)
    return out


def _alaw_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    base = (a & 0x0F) << 4
    mag = np.where(seg == 0, base + 8, (base + 0x108) << np.maximum(seg - 1, 0))
    out = np.where(a & 0x80, mag, -mag).astype(np.int16)
    out.setflags(write=False)
    return out


_ULAW_DECODE = _ulaw_table()
_ALAW_DECODE = _alaw_table()
# exponent (segment) of a 8-bit value: index of its highest set bit (0 for 0 and 1)
_SEGMENT = np.array([max(v.bit_length() - 1, 0) for v in range(256)], dtype=np.int32)


def ulaw_decode(data: bytes) -> np.ndarray:
    """G.711 mu-law bytes -> int16 samples."""
    return _ULAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def alaw_decode(data: bytes) -> np.ndarray:
    """G.711 A-law bytes -> int16 samples."""
    return _ALAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def ulaw_encode(samples: np.ndarray) -> bytes:
    """int16 samples -> G.711 mu-law bytes (bias 0x84, clip 32,635)."""
    x = np.asarray(samples, dtype=np.int32)
    neg = x < 0
    mag = np.minimum(np.abs(x), 32635) + 0x84
    exp = _SEGMENT[mag >> 7]
    mant = (mag >> (exp + 3)) & 0x0F
    code = (np.where(neg, 0x00, 0x80) | (exp << 4) | mant) ^ 0x7F
    return code.astype(np.uint8).tobytes()


def alaw_encode(samples: np.ndarray) -> bytes:
    """int16 samples -> G.711 A-law bytes (13-bit magnitude, even bits inverted)."""
    x = np.asarray(samples, dtype=np.int32) >> 3
    neg = x < 0
    mag = np.where(neg, -x - 1, x)  # 0 .. 4095
    seg = np.where(mag >= 32, _SEGMENT[np.minimum(mag >> 4, 255)], 0)
    mant = np.where(seg < 2, mag >> 1, mag >> np.maximum(seg, 1)) & 0x0F
    code = (seg << 4) | mant
    code = code ^ np.where(neg, 0x55, 0xD5)
    return code.astype(np.uint8).tobytes()


# --- streaming converters ------------------------------------------------------------------------------

_EMPTY_F32 = np.zeros(0, dtype=np.float32)


def _new_stream(in_rate: int, out_rate: int) -> soxr.ResampleStream:
    # float32 rather than int16: soxr's int16 output rounding depends on the chunk boundaries (LSB
    # differences), float32 streams give the same samples whatever the chunking.
    return soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32")


def _resample(stream: soxr.ResampleStream, x: np.ndarray | None, last: bool = False) -> np.ndarray:
    """int16 samples through a float32 stream -> int16 samples (rounded, clipped)."""
    f = _EMPTY_F32 if x is None else x.astype(np.float32) * np.float32(1.0 / 32768.0)
    y = stream.resample_chunk(f, last=last)
    return np.clip(np.rint(y * np.float32(32768.0)), -32768, 32767).astype(np.int16)


def _f32_to_i16(data: bytes) -> np.ndarray:
    x = np.frombuffer(data, dtype="<f4").astype(np.float64)
    x = np.nan_to_num(x, nan=0.0, posinf=1.0, neginf=-1.0)
    return np.round(np.clip(x, -1.0, 1.0) * 32767.0).astype(np.int16)


class InputConverter:
    """Client audio at ``sample_rate`` in ``format`` -> 16 kHz mono PCM16 (little-endian) bytes, streaming.

    ``feed(chunk)`` returns what the resampler has ready (possibly ``b""``, notably for the first chunks);
    ``flush()`` drains it (on commit) and leaves the converter ready for a new stream; ``clear()`` drops the
    pending state without output. A chunk whose size is not a whole number of samples raises
    :class:`AudioFormatError` with code ``bad_event``.
    """

    def __init__(self, format: Any = PCM16, sample_rate: Any = CORE_SAMPLE_RATE) -> None:
        self.format, fmt_rate = resolve_format(format)
        self.sample_rate = check_sample_rate(sample_rate)
        if fmt_rate is not None and fmt_rate != self.sample_rate:
            raise AudioFormatError(
                f"format rate {fmt_rate} conflicts with sample_rate {self.sample_rate}", "invalid_sample_rate"
            )
        self._width = _BYTES_PER_SAMPLE[self.format]
        self._stream = (
            None
            if self.sample_rate == CORE_SAMPLE_RATE
            else _new_stream(self.sample_rate, CORE_SAMPLE_RATE)
        )

    def decode(self, chunk: bytes) -> np.ndarray:
        """Decode one chunk to int16 samples at the input rate (no resampling)."""
        data = bytes(chunk)
        if len(data) % self._width:
            raise AudioFormatError(
                f"{self.format} audio needs a multiple of {self._width} bytes, got {len(data)}", "bad_event", "audio"
            )
        if self.format == PCM16:
            return np.frombuffer(data, dtype="<i2").astype(np.int16)
        if self.format == PCM_F32LE:
            return _f32_to_i16(data)
        if self.format == G711_ULAW:
            return ulaw_decode(data)
        return alaw_decode(data)

    def feed(self, chunk: bytes) -> bytes:
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


class OutputEncoder:
    """The model's 22,050 Hz PCM16 -> the session's output ``format`` at ``sample_rate``, streaming.

    ``sample_rate`` defaults to 24,000 for ``pcm16`` and 8,000 for G.711. ``feed(pcm16)`` returns the encoded
    audio ready so far (resampler output is uneven); ``flush()`` drains it at a response terminal and leaves the
    encoder ready for the next response. An odd trailing byte is carried to the next chunk.
    """

    def __init__(self, format: Any = PCM16, sample_rate: Any = None) -> None:
        self.format, fmt_rate = resolve_format(format, output=True)
        if sample_rate is None:
            sample_rate = fmt_rate
        if sample_rate is None:
            sample_rate = G711_DEFAULT_RATE if self.format in (G711_ULAW, G711_ALAW) else DEFAULT_OUTPUT_RATE
        self.sample_rate = check_sample_rate(sample_rate)
        self._carry = b""
        self._stream = (
            None
            if self.sample_rate == MODEL_SAMPLE_RATE
            else _new_stream(MODEL_SAMPLE_RATE, self.sample_rate)
        )

    @property
    def bytes_per_second(self) -> int:
        return self.sample_rate * (2 if self.format == PCM16 else 1)

    def _encode(self, x: np.ndarray) -> bytes:
        if self.format == PCM16:
            return x.astype("<i2").tobytes()
        if self.format == G711_ULAW:
            return ulaw_encode(x)
        return alaw_encode(x)

    def feed(self, pcm16: bytes) -> bytes:
        data = self._carry + bytes(pcm16)
        if len(data) % 2:
            self._carry, data = data[-1:], data[:-1]
        else:
            self._carry = b""
        x = np.frombuffer(data, dtype="<i2").astype(np.int16)
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
