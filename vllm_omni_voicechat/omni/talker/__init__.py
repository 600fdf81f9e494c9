"""Our Stage-1 talker for vLLM-Omni 0.30.0: vLLM-Omni's EAR-TTS talker with a noise source of each session's own.

``seed`` (stdlib): a talker request's seed from its session seed and epoch. ``rows`` (vLLM-Omni): a forward's rows
MoG-sampled together, each on its session's stream. ``model`` (vLLM): the registered talker subclass. Import the
submodules directly; this package imports nothing heavy.
"""

from ..thinker import register_architecture as _register

ARCHITECTURE = "VoiceChatRealtimeTalkerForConditionalGeneration"
MODEL_CLASS_PATH = "vllm_omni_voicechat.omni.talker.model:VoiceChatRealtimeTalker"


def register_architecture() -> bool:
    """Make ``ARCHITECTURE`` resolvable in this process, as for the thinker. Idempotent."""
    return _register(ARCHITECTURE, MODEL_CLASS_PATH)


__all__ = ["ARCHITECTURE", "MODEL_CLASS_PATH", "register_architecture"]
