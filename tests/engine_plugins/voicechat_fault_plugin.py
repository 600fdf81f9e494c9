"""A vLLM plugin for the engine tests only: our thinker with a fault (``voicechat_fault_thinker``), under an
architecture of its own.

``tests/test_engine_faults.py`` puts this folder, and a ``*.dist-info`` naming :func:`register` as a
``vllm.general_plugins`` and ``vllm_omni.general_plugins`` entry point, on the engine server's ``PYTHONPATH``; vLLM
loads the plugin in every process, as it loads ours, and the test's deploy YAML names ``ARCHITECTURE`` for Stage 0.
Nothing of it is in the serving path. Imports neither vLLM nor torch (the class is registered by its path)."""

from __future__ import annotations

ARCHITECTURE = "VoiceChatFaultyThinkerForTests"
CLASS_PATH = "voicechat_fault_thinker:FaultyThinker"
ENTRY_POINT = "voicechat_test_faults"


def register() -> None:
    from vllm_omni_voicechat.omni.thinker import register_architecture

    register_architecture(ARCHITECTURE, CLASS_PATH)
