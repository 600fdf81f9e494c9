"""``CpuOmniPlatform``: vLLM's ``CpuPlatform`` with the OmniPlatform interface vLLM-Omni's engines ask for.

Everything vLLM itself needs (attention backend, config checks, KV sizing) comes from ``CpuPlatform``; the
methods here only answer vLLM-Omni's questions: which stage workers to start, the torch device, memory from the
host (psutil), no inductor or talker graph capture, and torch SDPA for any diffusion attention.
"""

from __future__ import annotations

import psutil
import torch
from vllm.platforms.cpu import CpuPlatform
from vllm_omni.platforms.interface import OmniPlatform, OmniPlatformEnum

from . import AR_WORKER_CLS, GENERATION_WORKER_CLS


class CpuOmniPlatform(OmniPlatform, CpuPlatform):
    _omni_enum = OmniPlatformEnum.OOT

    @classmethod
    def get_omni_ar_worker_cls(cls) -> str:
        return AR_WORKER_CLS

    @classmethod
    def get_omni_generation_worker_cls(cls) -> str:
        return GENERATION_WORKER_CLS

    @classmethod
    def get_default_stage_config_path(cls) -> str:
        return "vllm_omni/deploy"

    @classmethod
    def get_diffusion_attn_backend_cls(
        cls, selected_backend: str | None, head_size: int, allow_trtllm_default: bool = False
    ) -> str:
        from vllm_omni.diffusion.attention.backends.registry import DiffusionAttentionBackendEnum

        return DiffusionAttentionBackendEnum.TORCH_SDPA.get_path()

    @classmethod
    def supports_diffusion_dense_flash_attention(cls) -> bool:
        return False

    @classmethod
    def supports_torch_inductor(cls) -> bool:
        # Stages run eager on CPU; inductor compiles would dominate a 2-core start-up.
        return False

    @classmethod
    def supports_talker_mtp_graph_capture(cls) -> bool:
        return False

    @classmethod
    def get_torch_device(cls, local_rank: int | None = None) -> torch.device:
        return torch.device("cpu")

    @classmethod
    def get_device_count(cls) -> int:
        return 1

    @classmethod
    def get_device_version(cls) -> str | None:
        return None

    @classmethod
    def synchronize(cls) -> None:
        return None

    @classmethod
    def get_free_memory(cls, device: torch.device | None = None) -> int:
        return int(psutil.virtual_memory().available)

    @classmethod
    def get_device_memory(cls, device: torch.device | None = None) -> tuple[int, int]:
        memory = psutil.virtual_memory()
        return int(memory.available), int(memory.total)

    @classmethod
    def set_device_control_env_var(cls, devices: str | int | None) -> None:
        # One host: there is no device mask to set (stage YAMLs say devices: "0").
        return None

    @classmethod
    def unset_device_control_env_var(cls) -> None:
        return None
