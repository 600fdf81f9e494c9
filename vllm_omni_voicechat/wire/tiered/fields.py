"""Field validators shared by the event parser and the session settings (each maps failures to its own codes)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ...errors import VoicechatError
from .audio import check_sample_rate, resolve_format


class FieldRejected(VoicechatError):
    """A field the reader refuses: the wire ``code`` to answer with, the message and the offending ``param``."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


def is_number(value: Any) -> bool:
    """A finite JSON number (not a boolean; an integer beyond float range is not finite)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def format_and_rate(value: Any, param: str, *, output: bool) -> tuple[str | None, int | None]:
    """A format as a string or a GA object ``{type, rate}`` -> (canonical name, rate or None); a GA object
    without ``type`` only carries a rate. Raises :class:`~.audio.AudioFormatError` (``invalid_sample_rate`` or
    ``unsupported_audio_format``, with the offending ``param``)."""
    if isinstance(value, Mapping) and value.get("type") is None:
        rate = value.get("rate")
        return None, None if rate is None else check_sample_rate(rate, f"{param}.rate")
    return resolve_format(value, output=output, param=param)
