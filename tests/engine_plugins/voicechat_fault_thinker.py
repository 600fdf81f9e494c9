"""Our thinker with a fault, for the engine tests only (registered by ``voicechat_fault_plugin``): a session whose
instructions contain ``FAULT_MARKER`` has its per-position hook raise on its first position, as a bug in our hooks
would (the request fails, its session gets the error, the engine and every other session go on)."""

from __future__ import annotations

from typing import Any

from vllm_omni_voicechat.omni.thinker.model import VoiceChatRealtimeThinker

FAULT_MARKER = "[fault: raise in the thinker]"


class FaultyThinker(VoiceChatRealtimeThinker):
    def _begin_position(self, request_id: str, duplex: dict[str, Any], session: dict[str, Any]) -> None:
        if FAULT_MARKER in str((duplex.get("runtime_config") or {}).get("instructions") or ""):
            raise RuntimeError(f"fault injected by the test plugin: the instructions name {FAULT_MARKER!r}")
        super()._begin_position(request_id, duplex, session)
