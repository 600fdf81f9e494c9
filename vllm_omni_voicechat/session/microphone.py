"""Microphone audio on its way to the work queue: reassembly into 80 ms frames, their transport numbering, the
leading-silence gate with its onset pre-roll, commit tail padding and the backlog bound."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..audio.frames import INPUT_FRAME_BYTES, FrameAssembler
from .gate import InputGate, MicFrame
from .work import TailPadding, WorkQueue

if TYPE_CHECKING:
    from .core import SessionConfig


class Microphone:
    def __init__(self, config: SessionConfig, work: WorkQueue) -> None:
        self.gate = InputGate(
            threshold_dbfs=config.gate_threshold_dbfs,
            open_after=config.gate_open_after,
            preroll_frames=config.preroll_frames,
            onset_context=config.onset_context_frames,
        )
        self.assembler = FrameAssembler(INPUT_FRAME_BYTES)
        self.max_queued_frames = config.max_queued_input_frames
        self._work = work
        self._transport_frames = 0
        self.last_frame_at: float | None = None
        """When the last complete frame reached the host: the client's next one is expected a frame later."""

    def backlogged(self, incoming: int) -> bool:
        """Whether ``incoming`` bytes would put more frames in the queue than the bound allows."""
        limit = self.max_queued_frames
        if len(self._work) + incoming // INPUT_FRAME_BYTES <= limit:
            return False  # the cheap bound: the queue holds at least its frames
        return self._work.audio_frames() + incoming // INPUT_FRAME_BYTES > limit

    def push(self, pcm: bytes, now: float, arrived: float | None = None) -> list[tuple[MicFrame, int]]:
        """Queue the complete frames the gate lets through; the frames it held, each with the pre-roll size.
        ``arrived``: when the audio reached the host, if before ``now``."""
        gate, held = self.gate, []
        for chunk in self.assembler.push(pcm):
            self.last_frame_at = now if arrived is None else arrived
            frame = gate.classify(chunk, self._transport_frames, now, arrived)
            self._transport_frames += 1
            released = gate.offer(frame)
            if released is None:
                held.append((frame, gate.held))
            else:
                self._work.extend(released)
        return held

    def open(self, now: float) -> None:
        """A client turn starts: the gate opens and its onset pre-roll is queued."""
        self._work.extend(self.gate.force_open(now))

    def pad_turn(self, now: float) -> None:
        """A client commit: the trailing partial frame runs zero-padded."""
        tail = self.assembler.pad()
        if tail is not None:
            self._work.append(TailPadding(tail, self._transport_frames, now))
            self._transport_frames += 1

    def end_input(self, now: float) -> None:
        """A model-owned commit: a short loud utterance the gate still holds counts; the partial frame runs
        zero-padded only once the gate is open."""
        gate = self.gate
        if not gate.is_open and gate.heard_loud:
            self._work.extend(gate.force_open(now))
        if gate.is_open:
            self.pad_turn(now)
        else:
            self.assembler.pad()  # audio the closed gate never admits

    def final_tail(self) -> bytes | None:
        """``session.stop``: the partial frame, zero-padded (None when there is none)."""
        return self.assembler.pad()

    def drop_partial(self) -> None:
        """A typed job was accepted: the partial frame and the gate's pre-roll are dropped."""
        self.assembler.discard()
        self.gate.clear()

    def clear(self) -> None:
        """Uncommitted audio is dropped: the partial frame, the pre-roll and every queued frame."""
        self.drop_partial()
        self._work.drop_audio()
