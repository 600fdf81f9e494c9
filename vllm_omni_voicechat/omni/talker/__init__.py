"""Our Stage-1 talker for vLLM-Omni 0.30.0: vLLM-Omni's EAR-TTS talker with a noise source of each session's own.

``seed`` (stdlib): a talker request's seed from its session seed and epoch. ``rows`` (vLLM-Omni): a forward's rows
MoG-sampled together, each on its session's stream. ``model`` (vLLM): the registered talker subclass. Import the
submodules directly; this package imports nothing heavy.
"""

ARCHITECTURE = "VoiceChatRealtimeTalkerForConditionalGeneration"
MODEL_CLASS_PATH = "vllm_omni_voicechat.omni.talker.model:VoiceChatRealtimeTalker"
MODEL_TYPE = "nemotron_voicechat"


def register_architecture() -> bool:
    """Make ``ARCHITECTURE`` resolvable in this process, as ``omni.thinker.register_architecture`` does for the
    thinker (vLLM's and vLLM-Omni's registries, vLLM-Omni's architecture -> config-type table). Idempotent."""
    added = False
    try:
        from vllm.model_executor.models import ModelRegistry
    except ModuleNotFoundError:
        return False
    if ARCHITECTURE not in ModelRegistry.models:
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS_PATH)
        added = True
    try:
        from vllm_omni.engine import arg_utils
        from vllm_omni.model_executor.models.registry import OmniModelRegistry
    except ModuleNotFoundError:
        return added
    if ARCHITECTURE not in OmniModelRegistry.models:
        OmniModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS_PATH)
        added = True
    arg_utils._ARCH_TO_MODEL_TYPE.setdefault(ARCHITECTURE, MODEL_TYPE)  # private table, as for the thinker
    return added
