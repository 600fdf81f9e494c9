"""Kyutai Pocket TTS as the typed-input synthesizer (optional extra ``pocket``; imported lazily).

Identical text gives identical PCM: generation is seeded per text from SHA-256 of the text and a base seed.
Output is resampled to 16 kHz with soxr.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import numpy as np
import soxr

from .port import SynthesizerUnavailable

DEFAULT_VOICE = "alba"


class PocketSynthesizer:
    name = "pocket-tts"

    def __init__(self, *, voice: str = DEFAULT_VOICE, base_seed: int = 0, prewarm_text: str = "Ready.") -> None:
        self.voice = voice
        self.base_seed = base_seed
        self.prewarm_text = prewarm_text
        self._model: Any = None
        self._state: Any = None
        self._lock = threading.Lock()
        self.error: str | None = None

    @property
    def ready(self) -> bool:
        return self._model is not None

    def load(self) -> None:
        """Import pocket-tts, load weights and the voice, and prewarm; raises SynthesizerUnavailable."""
        try:
            import torch  # noqa: F401
            from pocket_tts import TTSModel  # type: ignore[import-not-found]
        except ImportError as exc:
            self.error = f"pocket-tts is not installed (pip install 'vllm-omni-voicechat[pocket]'): {exc}"
            raise SynthesizerUnavailable(self.error) from exc
        try:
            model = TTSModel.load_model()
            state = model.get_state_for_audio_prompt(self.voice)
        except Exception as exc:  # weights unavailable offline, bad voice, ...
            self.error = f"pocket-tts weights or voice {self.voice!r} unavailable: {exc}"
            raise SynthesizerUnavailable(self.error) from exc
        self._model, self._state = model, state
        self.synthesize(self.prewarm_text)

    def synthesize(self, text: str) -> bytes:
        if self._model is None:
            raise SynthesizerUnavailable(self.error or "pocket-tts is not loaded")
        import torch

        seed = int.from_bytes(hashlib.sha256(f"{self.base_seed}:{text}".encode()).digest()[:8], "little")
        with self._lock:
            torch.manual_seed(seed % (2**63))
            audio = self._model.generate_audio(self._state, text)
            rate = int(self._model.sample_rate)
        return to_pcm16_16k(np.asarray(audio.detach().cpu().numpy() if hasattr(audio, "detach") else audio), rate)


def to_pcm16_16k(samples: np.ndarray, sample_rate: int) -> bytes:
    """Float or int16 mono samples at any rate -> PCM16 mono 16 kHz."""
    x = np.asarray(samples).reshape(-1)
    if x.dtype == np.int16:
        x = x.astype(np.float32) / 32768.0
    x = x.astype(np.float32)
    if sample_rate != 16_000:
        x = soxr.resample(x, sample_rate, 16_000)
    return (np.clip(x, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()
