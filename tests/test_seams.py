"""Package seams: only the adapter folder may import vllm / vllm_omni; the core imports without them."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
from pathlib import Path

import vllm_omni_voicechat

PACKAGE = Path(vllm_omni_voicechat.__file__).parent
ADAPTER_FOLDER = "omni"  # the one folder allowed to import vllm / vllm_omni


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_only_the_adapter_folder_imports_vllm():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == ADAPTER_FOLDER:
            continue
        if _imports(path) & {"vllm", "vllm_omni"}:
            offenders.append(str(rel))
        if "torch" in _imports(path) and rel != Path("synth/pocket.py"):  # the optional Pocket TTS extra
            offenders.append(str(rel))
    assert offenders == []


def test_every_core_module_imports_without_vllm():
    blocked = {"vllm": None, "vllm_omni": None}
    saved = {k: sys.modules.get(k) for k in blocked}
    sys.modules.update(blocked)  # importing them now raises ImportError
    try:
        for info in pkgutil.walk_packages([str(PACKAGE)], prefix="vllm_omni_voicechat."):
            if info.name.split(".")[1] == ADAPTER_FOLDER:
                continue
            importlib.import_module(info.name)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def test_sans_io_layers_do_not_touch_clocks_threads_or_sockets():
    pure = ["runner", "session", "model", "audio"]
    forbidden = {"asyncio", "threading", "socket", "time", "concurrent"}
    for folder in pure:
        for path in (PACKAGE / folder).rglob("*.py"):
            assert not (_imports(path) & forbidden), path


def test_the_tallies_are_pure_and_only_the_exporter_imports_prometheus():
    for path in (PACKAGE / "ops").glob("*.py"):
        if path.name != "prometheus.py":
            assert not (_imports(path) & {"asyncio", "threading", "socket", "time", "prometheus_client"}), path
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if "prometheus_client" in _imports(p) and p.relative_to(PACKAGE) != Path("ops/prometheus.py")]
    assert offenders == []


def _relative_imports(path: Path) -> set[str]:
    """The package-relative modules ``path`` imports (``..sim.model`` from client/x.py -> ``sim.model``)."""
    tree = ast.parse(path.read_text(), str(path))
    here = path.relative_to(PACKAGE).parts[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(here[: len(here) - (node.level - 1)]) if node.level > 1 else list(here)
                found.add(".".join([*base, *(node.module.split(".") if node.module else [])]))
            elif node.module and node.module.startswith("vllm_omni_voicechat."):
                found.add(node.module.removeprefix("vllm_omni_voicechat."))
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("vllm_omni_voicechat.") for a in node.names
                         if a.name.startswith("vllm_omni_voicechat."))
    return found


def test_clients_bench_synth_and_trace_never_import_the_simulator():
    offenders = []
    for folder in ("client", "bench", "synth", "trace"):
        for path in (PACKAGE / folder).rglob("*.py"):
            if any(m == "sim" or m.startswith("sim.") for m in _relative_imports(path)):
                offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []


def test_the_package_holds_no_test_harness():
    assert not [p for p in PACKAGE.rglob("*.py") if "fuzz" in p.stem]
