"""Checks of an environment that has the real vLLM 0.30 + vLLM-Omni 0.30 stack installed.

Made by ``scripts/install_omni_cpu.sh VENV --with-tests`` on a CPU-only machine (or the ``omni`` extra on a
GPU machine); run as ``VENV/bin/python -m pytest tests/test_omni_install.py``. Everywhere else (e.g. the
project's plain dev venv) the whole module is skipped.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm_omni") is None,
    reason="vllm_omni is not installed (create an omni venv with scripts/install_omni_cpu.sh)",
)

CLI_TIMEOUT_S = 300  # one `vllm-omni ... --help` takes 15-25 s on a 2-core machine
NEMOTRON_PLUGIN = "vllm_omni.model_executor.models.nemotron_voicechat.duplex.plugin.NemotronVoiceChatDuplexPlugin"


def _cpu_torch() -> bool:
    import torch

    return torch.version.cuda is None and getattr(torch.version, "hip", None) is None


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env={**os.environ, **env},
    )


def _vllm_omni_cli() -> str:
    beside = Path(sys.executable).with_name("vllm-omni")
    found = str(beside) if beside.exists() else shutil.which("vllm-omni")
    if found is None:
        pytest.fail("vllm_omni is importable but its `vllm-omni` console script is missing")
    return found


# --------------------------------------------------------------------------- shim


def test_shim_is_active_from_startup_and_costs_nothing_until_needed():
    if not _cpu_torch():
        pytest.skip("CUDA/ROCm torch: the CPU shim is neither installed nor needed")
    probe = _run_python(
        "import sys\n"
        "finders = [f for f in sys.meta_path if getattr(f, '_vllm_omni_voicechat_cpu_shim', False)]\n"
        "print(len(finders), 'torch' in sys.modules, 'torchvision' in sys.modules)\n"
    )
    assert probe.returncode == 0, probe.stderr
    # one finder, installed by the venv's .pth file, and nothing heavy imported at start-up
    assert probe.stdout.split() == ["1", "False", "False"], probe.stdout


def test_shim_install_is_idempotent_and_can_be_disabled(monkeypatch):
    import importlib

    from vllm_omni_voicechat.omni import cpu_shim

    def count() -> int:
        return sum(getattr(f, "_vllm_omni_voicechat_cpu_shim", False) for f in sys.meta_path)

    assert cpu_shim.install() is True
    before = count()
    assert before == 1
    assert cpu_shim.install() is True
    importlib.import_module("vllm_omni_voicechat.omni.cpu_shim")
    assert count() == before == 1
    monkeypatch.setenv("VLLM_OMNI_VOICECHAT_CPU_SHIM", "0")
    assert cpu_shim.install() is False
    assert count() == 1  # disabling only stops new installs


def test_shim_fixes_fire_only_where_needed():
    probe = _run_python(
        "import torch, torchvision, torchaudio.functional, torchvision.transforms.v2\n"
        "from vllm_omni_voicechat.omni import cpu_shim\n"
        "print(sorted(cpu_shim.applied), torchvision.extension._has_ops(), torch.version.cuda is None)\n"
    )
    assert probe.returncode == 0, probe.stderr[-4000:]
    applied, has_ops, cpu = probe.stdout.strip().rsplit(" ", 2)
    if cpu == "True" and has_ops == "False":
        assert "'torchvision'" in applied and "'torchaudio'" in applied, probe.stdout
    else:
        assert applied == "[]", probe.stdout  # a CUDA torch (or a working extension) is left alone


# --------------------------------------------------------------------------- imports


def test_import_vllm_and_vllm_omni():
    import vllm
    import vllm_omni

    assert vllm.__version__.startswith("0.30."), vllm.__version__
    assert getattr(vllm_omni, "__version__", "0.30.0").startswith("0.30."), vllm_omni.__version__


def test_duplex_plugin_contract_names():
    from vllm_omni.engine.duplex.plugin import (
        DuplexDataPlane,
        DuplexModelPlugin,
        load_duplex_plugin,
        validate_duplex_plugin_sampling,
    )

    assert isinstance(DuplexModelPlugin, type) and isinstance(DuplexDataPlane, type)
    assert callable(load_duplex_plugin) and callable(validate_duplex_plugin_sampling)


def test_in_tree_nemotron_plugin_loads_and_its_sampling_validates():
    from vllm.sampling_params import SamplingParams
    from vllm_omni.engine.duplex.plugin import DuplexModelPlugin, load_duplex_plugin, validate_duplex_plugin_sampling

    plugin = load_duplex_plugin(NEMOTRON_PLUGIN, lambda *args, **kwargs: None)
    assert isinstance(plugin, DuplexModelPlugin)
    assert plugin.plugin_id
    validate_duplex_plugin_sampling(plugin, sampling_defaults=(SamplingParams(),) * 3)
    assert plugin.capabilities(max_sessions=1).as_dict()["chunk_period_ms"] == 80


def test_duplex_session_manager_builds_and_shuts_down_on_cpu():
    from vllm.sampling_params import SamplingParams
    from vllm_omni.config.stage_config import DuplexSessionRuntimeConfig
    from vllm_omni.engine.duplex.contracts import DuplexStagePort, DuplexStageSubmissionResult
    from vllm_omni.engine.duplex.plugin import load_duplex_plugin
    from vllm_omni.engine.duplex.session.manager import DuplexSessionManager

    class IdleStagePort(DuplexStagePort):
        @property
        def stage_count(self):
            return 3

        def sampling_defaults(self):
            return tuple(SamplingParams() for _ in range(3))

        def ensure_request(self, context):
            pass

        async def submit(self, submission):
            return DuplexStageSubmissionResult(request_id=submission.context.request_id, stage_id=0, replica_id=0)

        async def cleanup(self, request_ids, *, abort=False):
            pass

        async def abort_requests(self, request_ids):
            pass

    async def scenario():
        manager = DuplexSessionManager(
            plugin=load_duplex_plugin(NEMOTRON_PLUGIN, lambda *args, **kwargs: None),
            stage_port=IdleStagePort(),
            output_sink=asyncio.Queue(),
            result_sink=asyncio.Queue(),
            runtime_config=DuplexSessionRuntimeConfig(),
            model_config=None,
        )
        assert manager.active_count() == 0
        await manager.shutdown()

    asyncio.run(scenario())


# --------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("omni", [True, False], ids=["omni", "vllm"])
def test_vllm_omni_serve_help_exits_0(omni):
    argv = [_vllm_omni_cli(), "serve", *(["--omni"] if omni else []), "--help"]
    env = dict(os.environ)
    if not omni and _cpu_torch():
        # Without --omni the CLI hands over to vLLM's own, whose PyPI build cannot infer a device on CPU.
        env["VLLM_TARGET_DEVICE"] = "cpu"
    done = subprocess.run(argv, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "usage: vllm serve" in done.stdout
    if omni:
        assert "--omni" in done.stdout
