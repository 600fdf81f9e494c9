"""ITU-T G.711 mu-law and A-law: 256-entry numpy decode tables and vectorised encoders (the stdlib ``audioop``
is gone in Python 3.13)."""

from __future__ import annotations

import numpy as np

__all__ = ["alaw_decode", "alaw_encode", "ulaw_decode", "ulaw_encode"]


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
