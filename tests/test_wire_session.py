"""One wire base: both dialects' protocol objects drive their core through ``WireSession``'s forwarding, and each
offers the whole driving interface the hosts use."""

from __future__ import annotations

import pytest

from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.shell.driving import WireDriven
from vllm_omni_voicechat.wire.session import WireSession
from vllm_omni_voicechat.wire.tiered.connection import TieredSession
from vllm_omni_voicechat.wire.v3.connection import V3Session

FORWARDED = ("fail", "prefilled", "prefill_failed", "synthesis_done", "synthesis_failed", "poisoned", "disconnect",
             "refusal_id")


@pytest.mark.parametrize("cls, policy", [(V3Session, "client"), (TieredSession, "model")])
def test_each_dialect_is_a_wire_session_with_the_whole_driving_interface(cls, policy):
    session = cls(SessionCore(SessionConfig(turn_policy=policy)))
    assert isinstance(session, WireSession) and isinstance(session, WireDriven)
    for name in FORWARDED:
        assert name not in vars(cls), f"{cls.__name__}.{name} repeats the base's forwarding"
    assert session.session_id == session.core.session_id


def test_a_completion_goes_to_the_core_and_comes_back_projected():
    core = SessionCore(SessionConfig(turn_policy="client"))
    session = V3Session(core)
    out = session.poisoned("the previous session's cleanup failed", 0.0)
    assert core.closed and session.closed
    texts = [o.json() for o in out if hasattr(o, "json")]
    assert texts[0]["type"] == "error" and texts[0]["error"]["code"] == "model_cleanup_failed"
    assert session.disconnect(1.0) == []  # closed already: nothing more
