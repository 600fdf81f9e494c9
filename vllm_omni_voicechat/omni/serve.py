"""``vllm-omni-voicechat serve MODEL ...``: delegate to ``vllm-omni serve MODEL --omni`` with our deploy YAML.

Our pipeline is registered first (the entry point would do it too; this keeps the wrapper independent of
``VLLM_PLUGINS``), then vLLM-Omni's own CLI (``vllm_omni.entrypoints.cli.main:main``) runs with the rest of the
arguments, so both commands serve through the same path.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .register import PACKAGED_DEPLOY_CONFIG, register


def omni_argv(model: str, extra: Sequence[str]) -> list[str]:
    """The ``vllm-omni`` argv for ``model``: ``--omni`` always, our packaged deploy YAML unless one is given."""
    argv = ["vllm-omni", "serve", model, *extra]
    if "--omni" not in argv:
        argv.append("--omni")
    if not any(a == "--deploy-config" or a.startswith("--deploy-config=") for a in argv):
        argv += ["--deploy-config", str(PACKAGED_DEPLOY_CONFIG)]
    return argv


def main(model: str, extra: Sequence[str]) -> int:
    register()
    from vllm_omni.entrypoints.cli.main import main as omni_main

    sys.argv = omni_argv(model, extra)
    result = omni_main()
    return int(result or 0)
