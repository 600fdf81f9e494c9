"""CPU stage workers for vLLM-Omni: vLLM's ``CPUWorker`` hosting vLLM-Omni's AR / generation model runners.

vLLM-Omni's own workers raise "Not support device type" on CPU (``worker/gpu_ar_worker.py:112``,
``gpu_generation_worker.py:99``), so each stage worker here is vLLM's ``CPUWorker`` (CPU memory, thread binding,
gloo) with vLLM-Omni's ``OmniWorkerMixin`` (its plugins in the worker process), whose runner is vLLM-Omni's
runner laid over vLLM's ``CPUModelRunner``:

    CpuOmniARModelRunner -> GPUARModelRunner -> OmniGPUModelRunner -> ... -> CPUModelRunner -> GPUModelRunner

vLLM-Omni's hooks (hidden states, multimodal outputs, connectors, duplex sampling) come first; the CPU runner
replaces the device buffers and loads the model without CUDA. ``CPUModelRunner.load_model`` does not call
``super()``, and in this order it does not have to: vLLM-Omni's ``load_model`` calls it through the MRO and then
runs its own post-load hooks.
"""

from __future__ import annotations

import torch
from vllm.logger import init_logger
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner
from vllm_omni.worker.gpu_generation_model_runner import GPUGenerationModelRunner
from vllm_omni.worker.mixins import OmniWorkerMixin

logger = init_logger(__name__)


class CpuOmniARModelRunner(GPUARModelRunner, CPUModelRunner):
    """vLLM-Omni's autoregressive runner (thinker, talker) on vLLM's CPU runner."""


class CpuOmniGenerationModelRunner(GPUGenerationModelRunner, CPUModelRunner):
    """vLLM-Omni's generation runner (code2wav) on vLLM's CPU runner."""


class _CpuOmniWorker(OmniWorkerMixin, CPUWorker):
    model_runner_cls: type

    def init_device(self) -> None:
        super().init_device()  # distributed env (gloo), seed, and a plain CPUModelRunner we replace
        if self.use_v2_model_runner:
            logger.warning("vLLM-Omni's hooks live in the v1 runner; using it on CPU")
            self.use_v2_model_runner = False
        self.model_runner = self.model_runner_cls(self.vllm_config, torch.device("cpu"))


class CpuOmniARWorker(_CpuOmniWorker):
    model_runner_cls = CpuOmniARModelRunner


class CpuOmniGenerationWorker(_CpuOmniWorker):
    model_runner_cls = CpuOmniGenerationModelRunner


__all__ = [
    "CpuOmniARModelRunner",
    "CpuOmniARWorker",
    "CpuOmniGenerationModelRunner",
    "CpuOmniGenerationWorker",
]
