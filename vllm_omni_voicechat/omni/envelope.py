"""What one model position carries into Stage 0 and how its audio is shaped (docs/omni-integration.md §2.2).

Pure (numpy only): the ``vc`` key our plugin adds to ``model_intermediate_buffer["duplex"]`` of each append,
and the PCM conversions between our 16 kHz PCM16 frames / 22.05 kHz PCM16 packets and vLLM-Omni's float32 audio.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..audio.frames import INPUT_FRAME_BYTES, INPUT_FRAME_SAMPLES
from ..model.port import PositionControls

VC_KEY = "vc"
VC_VERSION = 1

TokenIds = Callable[[Sequence[str]], list[int]]


class EnvelopeError(ValueError):
    """A position envelope that does not match what the port sent (a protocol bug between port and plugin)."""


def encode_controls(controls: PositionControls, *, position: int, synthetic: bool, token_ids: TokenIds) -> dict:
    """The ``vc`` dict of one position. ``reset`` is not sent: the port executes it (a new Stage-0 request)."""
    return {
        "v": VC_VERSION,
        "position": position,
        "synthetic": synthetic,
        "eou_now": controls.eou_now,
        "eou_at_fence": controls.eou_at_fence,
        "cancel_eou": controls.cancel_eou,
        "agent_eos": controls.agent_eos,
        "force_text_pad": controls.force_text_pad,
        "pre_eou": controls.pre_eou,
        "tool_result_token_ids": list(token_ids(controls.tool_result_tokens)) if controls.tool_result_tokens else [],
    }


def check_envelope(vc: Any, expected_position: int) -> dict:
    """Validate a ``vc`` dict popped for an append: the version and the position must be the ones expected."""
    if not isinstance(vc, dict) or vc.get("v") != VC_VERSION:
        raise EnvelopeError(f"not a v{VC_VERSION} position envelope: {vc!r}")
    if vc.get("position") != expected_position:
        raise EnvelopeError(f"envelope for position {vc.get('position')!r}, expected {expected_position}")
    return vc


def frame_to_f32(pcm16: bytes) -> np.ndarray:
    """One 80 ms input frame (1,280 PCM16 samples) as the float32 samples vLLM-Omni's append path takes."""
    if len(pcm16) != INPUT_FRAME_BYTES:
        raise EnvelopeError(f"a position frame is {INPUT_FRAME_BYTES} bytes, got {len(pcm16)}")
    out = np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0
    assert out.shape == (INPUT_FRAME_SAMPLES,)
    return out


def f32_to_pcm16(samples: np.ndarray) -> bytes:
    """Stage-2 float32 audio (nominally in [-1, 1]) as PCM16, clipped, rounded, little-endian."""
    x = np.nan_to_num(np.asarray(samples, dtype=np.float64), nan=0.0, posinf=1.0, neginf=-1.0)
    return np.round(np.clip(x, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
