"""``vllm-omni-voicechat serve MODEL ...``: delegate to ``vllm-omni serve MODEL --omni`` with our deploy YAML.

Our pipeline is registered first (the entry point would do it too; this keeps the wrapper independent of
``VLLM_PLUGINS``), then vLLM-Omni's own CLI (``vllm_omni.entrypoints.cli.main:main``) runs with the rest of the
arguments, so both commands serve through the same path. The engine's environment (``ENGINE_ENV_DEFAULTS``) is
set unless the caller set it: vLLM-Omni's event-driven orchestrator, and on CPU each stage's worker inside its
engine-core process (docs/engine-on-cpu.md, "No busy polling"; docs/running-on-gpu.md for a GPU).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from .register import PACKAGED_DEPLOY_CONFIG, register


def omni_argv(model: str, extra: Sequence[str]) -> list[str]:
    """The ``vllm-omni`` argv for ``model``: ``--omni`` always, our packaged deploy YAML unless one is given."""
    argv = ["vllm-omni", "serve", model, *extra]
    if "--omni" not in argv:
        argv.append("--omni")
    if not any(a == "--deploy-config" or a.startswith("--deploy-config=") for a in argv):
        argv += ["--deploy-config", str(PACKAGED_DEPLOY_CONFIG)]
    return argv


ENGINE_ENV_DEFAULTS: Mapping[str, str] = {
    # the orchestrator waits on its stages' output sockets instead of polling each every 1 ms
    "VLLM_OMNI_EVENT_DRIVEN_ORCH": "1",
}
CPU_ENGINE_ENV_DEFAULTS: Mapping[str, str] = {
    # vLLM's CPU platform otherwise gives each one-device stage a worker process whose shared-memory queues spin
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


def engine_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What to add to ``environ`` for the engine (never what the caller set)."""
    defaults = dict(ENGINE_ENV_DEFAULTS)
    if environ.get("VLLM_TARGET_DEVICE") == "cpu":
        defaults.update(CPU_ENGINE_ENV_DEFAULTS)
    return {k: v for k, v in defaults.items() if k not in environ}


def main(model: str, extra: Sequence[str]) -> int:
    os.environ.update(engine_env(os.environ))
    register()
    from vllm_omni.entrypoints.cli.main import main as omni_main

    sys.argv = omni_argv(model, extra)
    result = omni_main()
    return int(result or 0)
