"""Audio formats and rates of the tiered dialect (docs/tiered-dialect.md §8): pure, no sockets.

* :func:`resolve_format` folds the beta (flat string) and GA (``{"type": "audio/pcm", "rate": 24000}``)
  spellings of an audio format into a canonical name and an optional rate.
* :func:`input_sample_rate` / :func:`output_sample_rate` apply the §8.1 / §8.2 rate precedence.
* :class:`InputConverter` / :class:`OutputEncoder` are ``audio/convert.py``'s streaming converters, built from
  any of those spellings and validated rates (8,000-192,000 Hz), raising :class:`AudioFormatError` with the wire
  code to answer with (``flush()`` on commit / at every terminal, ``clear()`` on clear).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...audio.convert import (
    FORMATS,
    G711_ALAW,
    G711_ULAW,
    PCM16,
    PCM_F32LE,
    AudioPayloadError,
    PcmDecoder,
    PcmEncoder,
)
from ...audio.frames import INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE
from ...errors import VoicechatError

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
    "check_sample_rate",
    "input_sample_rate",
    "output_sample_rate",
    "resolve_format",
]

CORE_SAMPLE_RATE = INPUT_SAMPLE_RATE  # the core's AppendAudio contract: PCM16 mono 16 kHz
MODEL_SAMPLE_RATE = OUTPUT_SAMPLE_RATE  # the model's output: PCM16 mono 22,050 Hz
DEFAULT_OUTPUT_RATE = 24_000
G711_DEFAULT_RATE = 8_000
MIN_SAMPLE_RATE = 8_000
MAX_SAMPLE_RATE = 192_000
#: default pcm input rate per lane (§1.2)
DEFAULT_INPUT_RATES: Mapping[str, int] = {"full": 16_000, "openai": 24_000}

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


class AudioFormatError(VoicechatError, ValueError):
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


# --- streaming converters (the conversion itself is audio/convert.py's) -------------------------------


class InputConverter(PcmDecoder):
    """Client audio at ``sample_rate`` in ``format`` (any §8.1 spelling) -> 16 kHz mono PCM16, streaming.

    ``feed(chunk)`` returns what the resampler has ready (possibly ``b""``, notably for the first chunks);
    ``flush()`` drains it (on commit) and leaves the converter ready for a new stream; ``clear()`` drops the
    pending state without output. A chunk whose size is not a whole number of samples raises
    :class:`AudioFormatError` with code ``bad_event``.
    """

    def __init__(self, format: Any = PCM16, sample_rate: Any = CORE_SAMPLE_RATE) -> None:
        fmt, fmt_rate = resolve_format(format)
        rate = check_sample_rate(sample_rate)
        if fmt_rate is not None and fmt_rate != rate:
            raise AudioFormatError(f"format rate {fmt_rate} conflicts with sample_rate {rate}", "invalid_sample_rate")
        super().__init__(fmt, rate)

    def decode(self, chunk: bytes) -> np.ndarray:
        try:
            return super().decode(chunk)
        except AudioPayloadError as exc:
            raise AudioFormatError(str(exc), "bad_event", "audio") from None


class OutputEncoder(PcmEncoder):
    """The model's 22,050 Hz PCM16 -> the session's output ``format`` at ``sample_rate``, streaming.

    ``sample_rate`` defaults to 24,000 for ``pcm16`` and 8,000 for G.711. ``feed(pcm16)`` returns the encoded
    audio ready so far (resampler output is uneven); ``flush()`` drains it at a response terminal and leaves the
    encoder ready for the next response. An odd trailing byte is carried to the next chunk.
    """

    def __init__(self, format: Any = PCM16, sample_rate: Any = None) -> None:
        fmt, fmt_rate = resolve_format(format, output=True)
        if sample_rate is None:
            sample_rate = fmt_rate
        if sample_rate is None:
            sample_rate = G711_DEFAULT_RATE if fmt in (G711_ULAW, G711_ALAW) else DEFAULT_OUTPUT_RATE
        super().__init__(fmt, check_sample_rate(sample_rate))
