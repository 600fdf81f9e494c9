"""The leading-silence input gate and its bounded onset pre-roll.

Before the first speech, frames are held instead of advancing the model; the last ``preroll_frames`` held frames
are kept so that a ``turn_start`` (or the gate opening on speech by itself) releases the onset that tripped the
client's VAD. Once open, the gate stays open for the rest of the session.
"""

from __future__ import annotations

from collections import deque

from ..audio.frames import dbfs
from ..records import record


@record
class MicFrame:
    """A complete 80 ms microphone frame and its transport number (0-based count of assembled frames)."""

    pcm: bytes
    transport_frame: int
    loud: bool
    ready: float = 0.0
    """When it could run: when it was handed to the session, or the gate's release for a pre-roll frame."""
    arrived: float | None = None
    """When its audio reached the host, if earlier than ``ready`` (it waited for the position in flight): lateness
    counts from then (a position starting >= 40 ms after it is late: step queueing). None: ``ready``."""


class InputGate:
    def __init__(
        self,
        *,
        threshold_dbfs: float = -40.0,
        open_after: int = 3,
        preroll_frames: int = 12,
        onset_context: int = 2,
    ) -> None:
        if open_after < 1 or preroll_frames < 1 or onset_context < 0:
            raise ValueError("invalid gate bounds")
        self.threshold_dbfs = threshold_dbfs
        self.open_after = open_after
        self.onset_context = onset_context
        self.is_open = False
        self._held: deque[MicFrame] = deque(maxlen=preroll_frames)
        self._loud_run = 0

    def classify(self, pcm: bytes, transport_frame: int, now: float = 0.0, arrived: float | None = None) -> MicFrame:
        return MicFrame(pcm, transport_frame, dbfs(pcm) >= self.threshold_dbfs, now, arrived)

    def offer(self, frame: MicFrame) -> list[MicFrame] | None:
        """Pass a frame through: the frames to run now, or None when the gate held it."""
        if self.is_open:
            return [frame]
        self._held.append(frame)
        self._loud_run = self._loud_run + 1 if frame.loud else 0
        if self._loud_run >= self.open_after:
            return self.force_open(frame.ready)
        return None

    def force_open(self, now: float = 0.0) -> list[MicFrame]:
        """Open the gate (a ``turn_start`` does this) and release the onset suffix of the pre-roll, ready ``now``."""
        self.is_open = True
        held = list(self._held)
        self._held.clear()
        self._loud_run = 0
        first_loud = next((i for i, f in enumerate(held) if f.loud), None)
        if first_loud is not None:
            held = held[max(0, first_loud - self.onset_context) :]
        # A pre-roll frame is ready (and late) from its release; the frame that opened the gate keeps its arrival.
        return [MicFrame(f.pcm, f.transport_frame, f.loud, now, f.arrived if f.ready == now else None) for f in held]

    def clear(self) -> None:
        """Drop the pre-roll (typed input accepted)."""
        self._held.clear()
        self._loud_run = 0

    @property
    def heard_loud(self) -> bool:
        """Whether the held pre-roll contains speech energy."""
        return any(f.loud for f in self._held)

    @property
    def held(self) -> int:
        return len(self._held)
