"""Our Stage-2 codec for vLLM-Omni 0.30.0: vLLM-Omni's Nemotron VoiceChat code2wav, a forward's sessions decoded
together.

``model`` (vLLM-Omni): the registered code2wav subclass. Import it directly; this package imports nothing heavy.
"""

from ..thinker import register_architecture as _register

ARCHITECTURE = "VoiceChatRealtimeCode2Wav"
MODEL_CLASS_PATH = "vllm_omni_voicechat.omni.codec.model:VoiceChatRealtimeCode2Wav"


def register_architecture() -> bool:
    """Make ``ARCHITECTURE`` resolvable in this process, as for the thinker and the talker. Idempotent."""
    return _register(ARCHITECTURE, MODEL_CLASS_PATH)


__all__ = ["ARCHITECTURE", "MODEL_CLASS_PATH", "register_architecture"]
