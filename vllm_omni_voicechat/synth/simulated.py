"""The simulator synthesizer: text -> simulator speech, instant and deterministic."""

from __future__ import annotations

from ..audio.speech import render_speech


class SimulatorSynthesizer:
    name = "simulator"

    @property
    def ready(self) -> bool:
        return True

    def synthesize(self, text: str) -> bytes:
        return render_speech(text, 16_000)
