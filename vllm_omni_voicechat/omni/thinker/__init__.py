"""Our Stage-0 thinker for vLLM-Omni 0.30.0 (docs/thinker.md).

``rnnt`` (torch): the RNNT decoder + joint and its greedy per-position step. ``controls`` (torch-free): the
per-session control state machine that turns raw text/function predictions, RNNT evidence and the position's
``vc`` controls into effective tokens and the ``vc_step`` evidence. ``perception`` (vLLM-Omni): a forward's new frames
perceived in one encoder call. ``model`` (vLLM): the registered thinker
subclass that wires both into vLLM-Omni's Nemotron VoiceChat thinker. Import the submodules directly; this
package imports nothing heavy.
"""

ARCHITECTURE = "VoiceChatRealtimeThinkerForConditionalGeneration"
MODEL_CLASS_PATH = "vllm_omni_voicechat.omni.thinker.model:VoiceChatRealtimeThinker"
MODEL_TYPE = "nemotron_voicechat"
"""The checkpoint's config type (its config.json has none; vLLM-Omni patches it in from the architecture)."""


def register_architecture(architecture: str = ARCHITECTURE, class_path: str = MODEL_CLASS_PATH) -> bool:
    """Make ``architecture`` (``class_path``, ``module:Class``) resolvable in this process: vLLM's ``ModelRegistry``
    (lazy, so no torch import here), vLLM-Omni's ``OmniModelRegistry`` (what stage model configs resolve through) and
    vLLM-Omni's architecture -> config-type table. Idempotent; never replaces an existing entry. Called by
    ``omni.register.register`` in every process that loads the plugin entry points; a subclass of our thinker
    registered the same way (another plugin's) is named by a deploy YAML's Stage 0 instead (the engine tests' fault
    injection)."""
    added = False
    try:
        from vllm.model_executor.models import ModelRegistry
    except ModuleNotFoundError:
        return False
    if architecture not in ModelRegistry.models:
        ModelRegistry.register_model(architecture, class_path)
        added = True
    try:
        from vllm_omni.engine import arg_utils
        from vllm_omni.model_executor.models.registry import OmniModelRegistry
    except ModuleNotFoundError:
        return added
    if architecture not in OmniModelRegistry.models:
        OmniModelRegistry.register_model(architecture, class_path)
        added = True
    # Private table (vllm_omni/engine/arg_utils.py): without it the config.json (no model_type) cannot load.
    arg_utils._ARCH_TO_MODEL_TYPE.setdefault(architecture, MODEL_TYPE)
    return added
