"""Stage-2 audio -> one 80 ms packet per model position, with a fixed lag (docs/omni-integration.md §2.4, D5).

Stage 2 returns float32 audio in outputs of one or more 80 ms packets with no position index, so the port joins
them to positions by count: packet ``N - lag`` belongs to position ``N``. With ``lag > 0`` the first ``lag``
positions get primed silence and later packets arrive one or more positions after their tokens (the stages
overlap), so the response's end moves onto the audio timeline too (``BoundaryRetimer``). Pure: the port owns
waiting and locking.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import numpy as np

from ..audio.frames import OUTPUT_FRAME_SAMPLES, SILENT_OUTPUT_FRAME
from ..model.port import BoundaryPhase, ResponseBoundary
from .envelope import f32_to_pcm16


class AudioAligner:
    def __init__(self, lag: int = 0) -> None:
        if lag < 0:
            raise ValueError("lag must be >= 0")
        self.lag = lag
        self._partial = np.empty(0, dtype=np.float32)
        self._packets: deque[bytes] = deque()
        self.start()

    def start(self) -> None:
        """A fresh Stage-0 request: forget everything, prime ``lag`` silent packets."""
        self._partial = np.empty(0, dtype=np.float32)
        self._packets = deque([SILENT_OUTPUT_FRAME] * self.lag)

    def feed(self, samples: np.ndarray) -> int:
        """Add one Stage-2 output (float32 samples at 22,050 Hz); returns how many whole packets it completed."""
        x = np.concatenate([self._partial, np.asarray(samples, dtype=np.float32).reshape(-1)])
        whole = len(x) // OUTPUT_FRAME_SAMPLES
        for i in range(whole):
            self._packets.append(f32_to_pcm16(x[i * OUTPUT_FRAME_SAMPLES : (i + 1) * OUTPUT_FRAME_SAMPLES]))
        self._partial = x[whole * OUTPUT_FRAME_SAMPLES :]
        return whole

    @property
    def ready(self) -> int:
        return len(self._packets)

    @property
    def partial_samples(self) -> int:
        return len(self._partial)

    def take(self) -> bytes | None:
        """The next position's packet (PCM16, 1,764 samples), or None while Stage 2 has not produced it."""
        return self._packets.popleft() if self._packets else None


class BoundaryRetimer:
    """Moves ``boundary.ended`` from the position whose tokens ended a response to the one whose returned packet
    is its acoustic terminal, ``lag`` positions later (docs/omni-integration.md §2.4): at lag L step N returns the
    audio of N - L, so ending the response at N would cut its last L packets. Meanwhile the boundary reads
    ``tail_draining`` (the response is still playing out; a cancel tail waits for it too). A new response cannot
    start while an end is held: its BOS needs a user EOU, which needs a settlement of more than L positions
    (``omni/settings.py`` checks ``audio_lag_positions < settlement_blank_frames``)."""

    def __init__(self, lag: int = 0) -> None:
        if lag < 0:
            raise ValueError("lag must be >= 0")
        self.lag = lag
        self._held: ResponseBoundary | None = None
        self._left = 0

    def start(self) -> None:
        """A fresh Stage-0 request: an end still held belonged to the old one (its packets are dropped too)."""
        self._held, self._left = None, 0

    @property
    def holding(self) -> bool:
        return self._held is not None

    def retime(self, boundary: ResponseBoundary) -> ResponseBoundary:
        if self.lag == 0:
            return boundary
        if self._held is not None:
            self._left -= 1
            if self._left == 0:
                held, self._held = self._held, None
                return replace(boundary, ended=True, reason=held.reason)
            return replace(boundary, phase=BoundaryPhase.TAIL_DRAINING, ended=False, reason=None)
        if boundary.ended:
            self._held, self._left = boundary, self.lag
            return replace(boundary, phase=BoundaryPhase.TAIL_DRAINING, ended=False, reason=None)
        return boundary
