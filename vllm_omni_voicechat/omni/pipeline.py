"""Our vLLM-Omni 0.30.0 pipeline: the in-tree Nemotron VoiceChat topology served through our duplex plugin.

``VOICECHAT_PIPELINE`` is ``NEMOTRON_VOICECHAT_PIPELINE``
(``vllm_omni.model_executor.models.nemotron_voicechat.pipeline``) with five fields replaced; the stages (thinker
-> talker -> code2wav) and their stage-input processors
(``vllm_omni.model_executor.stage_input_processors.nemotron_voicechat``) are vLLM-Omni's. Our model classes are
named by the deploy YAML (a stage's ``model_arch``), not here.

Replaced fields:

* ``model_type``: ``register.PIPELINE_KEY``, a key of our own. Registering under the in-tree keys would silently
  change what vLLM-Omni serves for every Nemotron deployment; ours is only reached through ``pipeline:`` in our
  deploy YAML (or a model path whose basename contains it: the registry's longest-key basename match).
* ``duplex_plugin``: our ``VoiceChatDuplexPlugin``. Kept as a dotted string so that registration, which runs in
  every vLLM process, does not import the plugin's dependency graph; ``load_duplex_plugin`` imports it in the
  API process only.
* ``default_session_mode="duplex"``: the fallback when a deploy YAML has no ``session_mode``; our runtime only
  exists in duplex serving.
* ``stages``: each names our stage scheduler (``scheduler.py``: vLLM-Omni's, plus the engine tick's one forward on
  Stage 0 and a log of batch sizes), a class vLLM builds in the stage's engine-core process. Our YAMLs keep
  ``async_scheduling: false`` on every stage, the case in which vLLM-Omni picks the schedulers ours extend.
* ``default_deploy_config_name``: the ABSOLUTE path of our packaged ``deploy/voicechat.yaml``. vLLM-Omni joins it
  onto its own deploy folder (``vllm_omni.config.stage_config._DEPLOY_DIR / name``), and joining an absolute
  path yields that path, so every default-deploy lookup (``_should_serve_duplex``, ``OmniEngineBase.__init__``,
  ``StageConfigFactory``) finds our YAML instead of a missing file or the in-tree turn-based one. A bare
  filename would point into vLLM-Omni's own ``deploy/`` where our file does not exist.

This module imports ``vllm_omni``; ``register.register`` imports it lazily.
"""

from __future__ import annotations

from dataclasses import replace

from vllm_omni.config.stage_config import PipelineConfig
from vllm_omni.model_executor.models.nemotron_voicechat.pipeline import NEMOTRON_VOICECHAT_PIPELINE

from .register import PACKAGED_DEPLOY_CONFIG, PIPELINE_KEY
from .scheduler import STAGE_SCHEDULERS

# Same value as ``plugin.PLUGIN_PATH`` (a test asserts it); not imported from there, see the docstring.
VOICECHAT_DUPLEX_PLUGIN = "vllm_omni_voicechat.omni.plugin.VoiceChatDuplexPlugin"

# ``dataclasses.replace`` re-runs ``PipelineConfig.__post_init__`` validation.
VOICECHAT_PIPELINE: PipelineConfig = replace(
    NEMOTRON_VOICECHAT_PIPELINE,
    model_type=PIPELINE_KEY,
    duplex_plugin=VOICECHAT_DUPLEX_PLUGIN,
    default_session_mode="duplex",
    default_deploy_config_name=str(PACKAGED_DEPLOY_CONFIG),
    stages=tuple(replace(stage, scheduler_cls=STAGE_SCHEDULERS[stage.stage_id])
                 for stage in NEMOTRON_VOICECHAT_PIPELINE.stages),
)

__all__ = ["VOICECHAT_DUPLEX_PLUGIN", "VOICECHAT_PIPELINE"]
