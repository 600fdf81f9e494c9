"""Registration of our vLLM-Omni pipeline: the entry-point target of both plugin groups.

``pyproject.toml`` names ``register`` under two entry-point groups:

* ``vllm.general_plugins``: vLLM's ``vllm.plugins.load_general_plugins`` runs it once per process. In the
  ``vllm-omni serve ... --omni`` API process that happens while the serve parser is built
  (``vllm.engine.arg_utils.AsyncEngineArgs.add_cli_args``), i.e. before vLLM-Omni resolves the pipeline named by
  the deploy YAML (``vllm_omni.entrypoints.openai.api_server._should_serve_duplex``). This is the early hook.
* ``vllm_omni.general_plugins``: ``vllm_omni.plugins.load_omni_general_plugins`` (stage runtimes, workers).

Both may call it in the same process, and stage processes call it again: it is idempotent, never clobbers a key
someone else registered, and never makes ``register_pipeline`` warn. Entry points are only loaded by those
loaders, so Python processes that do not start vLLM pay nothing. This module itself imports neither ``vllm``,
``vllm_omni`` nor ``torch``; everything heavy is imported inside ``register``. A process with vLLM but without
vLLM-Omni (plain ``vllm serve``) gets a silent no-op. The group filter ``VLLM_PLUGINS`` must include
``ENTRY_POINT_NAME`` when a deployment sets it.
"""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger(__name__)

# Our registry key. Distinct from both in-tree Nemotron keys (``nemotron_voicechat``, ``nemotron_labs_voicechat``)
# so the in-tree pipeline stays what it is; the deploy YAML selects ours with ``pipeline:``.
PIPELINE_KEY = "nemotron_voicechat_realtime"
# The name of our entry point in both groups (what ``VLLM_PLUGINS`` lists).
ENTRY_POINT_NAME = "vllm_omni_voicechat"
ENTRY_POINT_VALUE = f"{__name__}:register"
ENTRY_POINT_GROUPS = ("vllm.general_plugins", "vllm_omni.general_plugins")
# The packaged deploy YAML (package data); ``deploy/voicechat.yaml`` at the repository root is an identical copy.
PACKAGED_DEPLOY_CONFIG = Path(__file__).resolve().parent / "deploy" / "voicechat.yaml"


def log_through_vllm() -> None:
    """Our loggers write through vLLM's handlers in every vLLM process (vLLM configures only its own logger tree, so
    without this our lines never reach a server's log: the mount's, the thinker's, the stage schedulers')."""
    ours, theirs = logging.getLogger(ENTRY_POINT_NAME), logging.getLogger("vllm")
    if theirs.handlers and not ours.handlers:
        for handler in theirs.handlers:
            ours.addHandler(handler)
        ours.setLevel(logging.INFO)
        ours.propagate = False


def register() -> bool:
    """Add our pipeline to ``vllm_omni.config.pipeline_registry.OMNI_PIPELINES`` unless the key is present.

    Returns True only when this call added it. Never raises: a failure is logged (the deploy YAML's
    ``pipeline:`` lookup then fails with vLLM-Omni's own ``KeyError``) rather than taking down whatever vLLM
    process is loading its plugins.
    """
    try:
        from vllm_omni.config.pipeline_registry import OMNI_PIPELINES, register_pipeline
    except ModuleNotFoundError as exc:
        if exc.name is not None and (exc.name == "vllm_omni" or exc.name.startswith("vllm_omni.")):
            logger.debug("vllm_omni is not installed; %s is not registered", PIPELINE_KEY)
            return False
        logger.warning("vllm_omni failed to import; %s is not registered", PIPELINE_KEY, exc_info=True)
        return False
    except Exception:
        logger.warning("vllm_omni failed to import; %s is not registered", PIPELINE_KEY, exc_info=True)
        return False

    log_through_vllm()
    from .bench import register_bench_backend

    register_bench_backend()  # `vllm-omni bench serve --backend voicechat`; a no-op outside vLLM-Omni's CLI
    try:
        # Our Stage-0 thinker architecture (the deploy YAML's stage 0 names it), in every process; idempotent.
        from .thinker import register_architecture

        register_architecture()
    except Exception:
        logger.warning("could not register the voicechat thinker architecture", exc_info=True)
    try:
        # Our Stage-1 talker architecture (a noise stream per session; the deploy YAML's stage 1 names it).
        from .talker import register_architecture as register_talker

        register_talker()
    except Exception:
        logger.warning("could not register the voicechat talker architecture", exc_info=True)
    try:
        # Our Stage-2 codec architecture (a forward's sessions decoded together; the deploy YAML's stage 2 names it).
        from .codec import register_architecture as register_codec

        register_codec()
    except Exception:
        logger.warning("could not register the voicechat codec architecture", exc_info=True)

    try:
        # Our chunk connector between stages (vLLM-Omni's shared-memory one, received without polling; the deploy
        # YAMLs name it), in every process that builds connectors; idempotent.
        from .connector import register_connector

        register_connector()
    except Exception:
        logger.warning("could not register the voicechat chunk connector", exc_info=True)

    if PIPELINE_KEY in OMNI_PIPELINES:
        # Ours from an earlier call (the other group, a stage process re-run) or someone else's: leave it alone.
        return False
    try:
        from .pipeline import VOICECHAT_PIPELINE

        register_pipeline(VOICECHAT_PIPELINE, model_type=PIPELINE_KEY)
    except Exception:
        logger.warning("could not register the vLLM-Omni pipeline %s", PIPELINE_KEY, exc_info=True)
        return False
    logger.debug("registered vLLM-Omni pipeline %s", PIPELINE_KEY)
    return True


__all__ = [
    "ENTRY_POINT_GROUPS",
    "ENTRY_POINT_NAME",
    "ENTRY_POINT_VALUE",
    "PACKAGED_DEPLOY_CONFIG",
    "PIPELINE_KEY",
    "log_through_vllm",
    "register",
]
