"""The 80 ms frame: constants, reassembly of arbitrary PCM16 chunks into exact frames, and levels."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

FRAME_MS = 80
FRAME_SECONDS = FRAME_MS / 1000
INPUT_SAMPLE_RATE = 16_000
OUTPUT_SAMPLE_RATE = 22_050
INPUT_FRAME_SAMPLES = INPUT_SAMPLE_RATE * FRAME_MS // 1000  # 1,280
OUTPUT_FRAME_SAMPLES = OUTPUT_SAMPLE_RATE * FRAME_MS // 1000  # 1,764
INPUT_FRAME_BYTES = INPUT_FRAME_SAMPLES * 2
OUTPUT_FRAME_BYTES = OUTPUT_FRAME_SAMPLES * 2
SILENT_INPUT_FRAME = bytes(INPUT_FRAME_BYTES)
SILENT_OUTPUT_FRAME = bytes(OUTPUT_FRAME_BYTES)


@lru_cache(maxsize=8)
def zero_bytes(n: int) -> bytes:
    """``n`` zero bytes, shared: comparing a chunk with it is one memcmp (digital silence, synthetic positions)."""
    return bytes(n)


def dbfs(pcm16: bytes) -> float:
    """RMS level of little-endian PCM16 in dB relative to full scale (-inf for digital silence)."""
    if pcm16 == zero_bytes(len(pcm16)):  # digital silence (the empty chunk too): a memcmp, no maths
        return -math.inf
    x = np.frombuffer(pcm16, dtype="<i2").astype(np.float64)
    ms = float(np.dot(x, x)) / x.size
    if ms <= 0.0:
        return -math.inf
    return 10.0 * math.log10(ms / (32768.0 * 32768.0))


class FrameAssembler:
    """Reassembles PCM16 byte chunks of any size into exact frames of ``frame_bytes``.

    A partial frame waits for more bytes; ``pad()`` zero-pads it into one final frame (commit tail padding)
    and ``discard()`` drops it (typed input gating). Chunks must hold whole samples (even length).
    """

    __slots__ = ("frame_bytes", "_buf")

    def __init__(self, frame_bytes: int = INPUT_FRAME_BYTES) -> None:
        if frame_bytes <= 0 or frame_bytes % 2:
            raise ValueError("frame_bytes must be a positive even number")
        self.frame_bytes = frame_bytes
        self._buf = bytearray()

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)

    def push(self, pcm16: bytes) -> list[bytes]:
        if len(pcm16) % 2:
            raise ValueError("PCM16 chunks must hold whole samples")
        if not self._buf and len(pcm16) == self.frame_bytes and type(pcm16) is bytes:
            return [pcm16]  # the usual append: exactly one frame, nothing pending (no copies)
        self._buf += pcm16
        n = len(self._buf) // self.frame_bytes
        if n == 0:
            return []
        fb = self.frame_bytes
        frames = [bytes(self._buf[i * fb : (i + 1) * fb]) for i in range(n)]
        del self._buf[: n * fb]
        return frames

    def pad(self) -> bytes | None:
        if not self._buf:
            return None
        frame = bytes(self._buf) + bytes(self.frame_bytes - len(self._buf))
        self._buf.clear()
        return frame

    def discard(self) -> int:
        n = len(self._buf)
        self._buf.clear()
        return n
