"""Where a talker request's noise comes from: a seed of its own, derived without any process-local state.

A session's seed is chosen when it opens (``plugin.VoiceChatDuplexPlugin``: the client's ``voicechat_seed``, else a
digest of the session's rendered prompt, so the same conversation is answered with the same audio) and reaches the
talker as its Stage-1 sampling seed. Each epoch of the session (a new Stage-0 request after a cancel) draws from a
stream of its own: the seed mixed with the epoch named in the request id. Without a session seed (a request of
another plugin) the request id alone is the seed: independent of other sessions, not reproducible across runs.
"""

from __future__ import annotations

import hashlib
import re

MAX_SEED = (1 << 63) - 1
_EPOCH = re.compile(r"\.e\.(\d+)\.")


def digest_seed(*parts: object) -> int:
    """A 63-bit seed from ``parts`` (blake2b: the same in every process, unlike ``hash``)."""
    data = "\x1f".join(str(p) for p in parts).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") & MAX_SEED


def epoch_of(request_id: str) -> int:
    """The epoch in a vLLM-Omni duplex request id (``duplex-s.<session>.e.<epoch>.r.<role>``); 0 when absent."""
    match = _EPOCH.search(request_id)
    return int(match.group(1)) if match else 0


def request_seed(request_id: str, session_seed: int | None) -> int:
    """The seed of one talker request."""
    if session_seed is None:
        return digest_seed("request", request_id)
    return digest_seed("session", session_seed, "epoch", epoch_of(request_id))


__all__ = ["MAX_SEED", "digest_seed", "epoch_of", "request_seed"]
