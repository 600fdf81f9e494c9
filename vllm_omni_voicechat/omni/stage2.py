"""The PCM in one Stage-2 (code2wav) output, whatever shape vLLM-Omni's output path gives it.

The real engine's ``MultimodalOutputProcessor`` hands the data plane outputs that may wrap the request output
(``request_output``), keep the multimodal dict on the output or on its first completion, name the audio ``audio``,
``model_outputs`` or ``latent``, and hold it as an array, a tensor or a list of per-step tensors, with its sample
rate under ``sr`` / ``sample_rate_hz``. Pure (numpy; tensors by duck typing): no vLLM import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..audio.frames import OUTPUT_SAMPLE_RATE
from ..errors import VoicechatError

AUDIO_KEYS = ("audio", "model_outputs", "latent")
RATE_KEYS = ("sr", "sample_rate_hz", "sample_rate")


class Stage2AudioError(VoicechatError, ValueError):
    """Stage 2 produced audio this runtime cannot use (another sample rate, not numbers)."""


def _multimodal(output: Any) -> Mapping[str, Any] | None:
    inner = getattr(output, "request_output", None)
    if inner is not None and inner is not output:
        output = inner
    outputs = getattr(output, "outputs", None)
    completion = outputs[0] if isinstance(outputs, list) and outputs else None
    for candidate in (getattr(output, "multimodal_output", None), getattr(completion, "multimodal_output", None)):
        if isinstance(candidate, Mapping) and candidate:
            return candidate
    return None


def _scalar(value: Any) -> Any:
    if isinstance(value, list | tuple) and value:
        value = value[-1]
    if hasattr(value, "item") and getattr(value, "size", 1) in (1, None):
        try:
            return value.item()
        except (TypeError, ValueError):
            return value
    return value


def _samples(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor (bf16 included), without importing torch here
        value = value.detach().float().cpu().numpy()
    return np.asarray(value, dtype=np.float32).reshape(-1)


def stage2_audio(output: Any) -> np.ndarray | None:
    """The float32 samples (22,050 Hz, mono) in ``output``, or None when it carries no audio."""
    mm = _multimodal(output)
    if mm is None:
        return None
    value = next((mm[key] for key in AUDIO_KEYS if mm.get(key) is not None), None)
    if value is None:
        return None
    rate = next((_scalar(mm[key]) for key in RATE_KEYS if mm.get(key) is not None), OUTPUT_SAMPLE_RATE)
    try:
        rate = int(rate)
    except (TypeError, ValueError) as exc:
        raise Stage2AudioError(f"Stage-2 sample rate {rate!r} is not a number") from exc
    if rate != OUTPUT_SAMPLE_RATE:
        raise Stage2AudioError(f"Stage-2 audio at {rate} Hz; this runtime needs {OUTPUT_SAMPLE_RATE} Hz")
    try:
        if isinstance(value, list | tuple):
            parts = [_samples(v) for v in value if v is not None]
            return np.concatenate(parts) if parts else np.empty(0, dtype=np.float32)
        return _samples(value)
    except (TypeError, ValueError) as exc:
        raise Stage2AudioError(f"Stage-2 audio is not numeric: {exc}") from exc
