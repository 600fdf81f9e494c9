"""Which checkpoint tensors are the RNNT's, and their names in ``rnnt.RnntModules`` (torch-free, so the GPU
verification script can inspect a checkpoint's headers without loading anything)."""

from __future__ import annotations

import re

# Checkpoint name -> our local name. NeMo names the subtrees ``decoder.prediction.{embed,dec_rnn.lstm}`` and
# ``joint.{enc,pred,joint_net.<i>}``; the VoiceChat checkpoint nests them under an ``rnnt`` prefix that the
# in-tree loader skips (exact prefix [unverified]: examples/gpu_verify_thinker.py lists what matched).
_LOCAL_NAMES = (
    (re.compile(r"(?:^|[._])prediction\.embed\.(weight)$"), "embed.{0}"),
    (re.compile(r"(?:^|[._])dec_rnn\.lstm\.((?:weight|bias)_(?:ih|hh)_l\d+)$"), "lstm.{0}"),
    (re.compile(r"(?:^|[._])joint\.enc\.(weight|bias)$"), "enc.{0}"),
    (re.compile(r"(?:^|[._])joint\.pred\.(weight|bias)$"), "pred.{0}"),
    (re.compile(r"(?:^|[._])joint_net\.\d+\.(weight|bias)$"), "out.{0}"),
)


def is_rnnt_name(name: str) -> bool:
    return any(part.startswith("rnnt") or part.endswith("rnnt") for part in name.split(".")[:3])


def local_rnnt_name(name: str) -> str | None:
    """Our module name for a checkpoint RNNT tensor, or None when it is not one we load."""
    if not is_rnnt_name(name):
        return None
    for pattern, local in _LOCAL_NAMES:
        m = pattern.search(name)
        if m:
            return local.format(m.group(1))
    return None
