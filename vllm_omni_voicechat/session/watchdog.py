"""Agent watchdogs: when an open response stalls, ask the model for agent EOS (not a protocol error).

Counted only while the response is speaking on its own (not cancelled, no function-call work in progress):
no text for 30 positions since BOS, no audible audio for 30 positions since BOS, or 20 consecutive positions of
decoded silence (<= -90 dBFS). The reason becomes the response's ``response.done.reason``.
"""

from __future__ import annotations

from ..audio.frames import dbfs
from ..model.port import StepResult

NO_TEXT_FRAMES = 30
NO_AUDIO_FRAMES = 30
DECODED_SILENCE_FRAMES = 20
SILENCE_DBFS = -90.0


class AgentWatchdog:
    def __init__(
        self,
        *,
        no_text_frames: int = NO_TEXT_FRAMES,
        no_audio_frames: int = NO_AUDIO_FRAMES,
        decoded_silence_frames: int = DECODED_SILENCE_FRAMES,
    ) -> None:
        self.no_text_frames = no_text_frames
        self.no_audio_frames = no_audio_frames
        self.decoded_silence_frames = decoded_silence_frames
        self.reset()

    def reset(self) -> None:
        """A new stretch of agent speech starts (BOS, or the end of a function cycle)."""
        self.frames = 0
        self.text_seen = False
        self.audio_seen = False
        self.silent_run = 0
        self.fired: str | None = None

    def observe(self, result: StepResult) -> str | None:
        """Count one speaking position; the watchdog reason the first time one trips, else None."""
        if self.fired is not None:
            return None
        self.frames += 1
        if result.agent.delta:
            self.text_seen = True
        if result.audio and dbfs(result.audio) > SILENCE_DBFS:
            self.audio_seen = True
            self.silent_run = 0
        else:
            self.silent_run += 1
        if self.silent_run >= self.decoded_silence_frames:
            self.fired = "decoded_silence_watchdog"
        elif not self.text_seen and self.frames >= self.no_text_frames:
            self.fired = "no_text_since_bos_watchdog"
        elif not self.audio_seen and self.frames >= self.no_audio_frames:
            self.fired = "no_audio_since_bos_watchdog"
        return self.fired
