"""Import shim that lets PyPI's CUDA-built torchvision / torchaudio / torchcodec import beside CPU torch.

On Linux x86_64, PyPI only has CUDA builds of these three packages. In a CPU-only install (torch-2.13.0+cpu,
see ``scripts/install_omni_cpu.sh``) their C++ extensions cannot load, and each reacts badly:

* torchvision: ``_meta_registrations`` registers fake kernels for ``torchvision::nms`` and ``::qnms`` without
  checking that the extension loaded, so ``import torchvision`` dies with "operator torchvision::nms does not
  exist". We define those two op schemas (no kernels) in a ``torch.library`` FRAGMENT just before that module
  runs; the pure-Python parts (``transforms.v2``, ...) then import. Calling the ops still fails, as it should.
* torchaudio: ``torchaudio._extension.utils._load_lib`` raises ``OSError`` on the CUDA ``.so``. We make an
  unloadable library count as absent (``False``), a case torchaudio already handles, so
  ``torchaudio.functional`` imports.
* torchcodec: loading its libraries raises ``OSError`` where vLLM only catches ``ImportError`` /
  ``RuntimeError``. We re-raise it as ``ImportError`` so vLLM falls back to soundfile / av.

Importing this module installs one ``sys.meta_path`` finder (idempotently). The finder only reacts to the
handful of module names above, so a process that never imports those packages pays one set lookup per
import and nothing else. Every fix checks first that torch is a CPU build (``torch.version.cuda is None``)
and that the extension really did not load, so beside a CUDA torch the shim changes nothing.
Set ``VLLM_OMNI_VOICECHAT_CPU_SHIM=0`` to disable it.
"""

from __future__ import annotations

import os
import sys

__all__ = ["install", "is_installed", "applied"]

# Names of the fixes that actually fired in this process, for tests and debugging.
applied: set[str] = set()

# Kept alive for the life of the process: a torch.library.Library drops its registrations when collected.
_torchvision_fragment = None

_MARKER = "_vllm_omni_voicechat_cpu_shim"


def _cpu_torch():
    """The already-imported torch module if it is a CPU-only build, else None (never imports torch)."""
    torch = sys.modules.get("torch")
    version = getattr(torch, "version", None)
    if version is None or getattr(version, "cuda", None) or getattr(version, "hip", None):
        return None
    return torch


def _before_torchvision_meta_registrations() -> None:
    global _torchvision_fragment
    torch = _cpu_torch()
    extension = sys.modules.get("torchvision.extension")
    if torch is None or extension is None or extension._has_ops():
        return  # CUDA torch, or torchvision's own extension loaded: its ops exist already.
    if hasattr(torch.ops.torchvision, "nms"):
        return  # somebody defined them already
    lib = torch.library.Library("torchvision", "FRAGMENT")
    # Schemas only (no kernels): what _meta_registrations needs to attach its fake implementations.
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _torchvision_fragment = lib
    applied.add("torchvision")


def _after_torchaudio_extension_utils(module) -> None:
    if _cpu_torch() is None:
        return
    original = module._load_lib

    def _load_lib(lib: str) -> bool:
        try:
            return original(lib)
        except OSError:
            applied.add("torchaudio")
            return False  # an unloadable library counts as absent

    _load_lib.__wrapped__ = original
    module._load_lib = _load_lib


def _wrap_exec(loader, before=None, after=None, oserror_as_importerror=False) -> None:
    """Patch this one loader instance's exec_module (the loader class and other modules are untouched)."""
    exec_module = loader.exec_module

    def wrapped(module):
        if before is not None:
            before()
        try:
            exec_module(module)
        except OSError as exc:
            if not (oserror_as_importerror and _cpu_torch() is not None):
                raise
            applied.add("torchcodec")
            raise ImportError(f"{module.__name__}: {exc}") from exc
        if after is not None:
            after(module)

    loader.exec_module = wrapped


class _CpuShimFinder:
    """Meta-path finder: asks the other finders for the spec, then hooks the loader of the few targets."""

    _vllm_omni_voicechat_cpu_shim = True
    _EXACT = frozenset({"torchvision._meta_registrations", "torchaudio._extension.utils"})

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self._EXACT and not (fullname == "torchcodec" or fullname.startswith("torchcodec.")):
            return None
        for finder in sys.meta_path:
            if finder is self or getattr(finder, _MARKER, False):
                continue
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(fullname, path, target) if find_spec is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        if fullname == "torchvision._meta_registrations":
            _wrap_exec(loader, before=_before_torchvision_meta_registrations)
        elif fullname == "torchaudio._extension.utils":
            _wrap_exec(loader, after=_after_torchaudio_extension_utils)
        else:
            _wrap_exec(loader, oserror_as_importerror=True)
        return spec

    def invalidate_caches(self) -> None:
        pass


def is_installed() -> bool:
    return any(getattr(finder, _MARKER, False) for finder in sys.meta_path)


def install() -> bool:
    """Put the finder first on sys.meta_path unless it is there already or disabled; True if it is active."""
    if os.environ.get("VLLM_OMNI_VOICECHAT_CPU_SHIM", "1").strip().lower() in {"0", "false", "no", "off"}:
        return False
    if not is_installed():
        sys.meta_path.insert(0, _CpuShimFinder())
    return True


install()
