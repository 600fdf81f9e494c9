"""What a balancer and its replicas agree on: which replica owns a session (read from the session id alone), and
the hint that another replica may take a session this one has no slot for.

A full-lane session id names its replica (``duplex-<replica>-<32 hex>``) so that a balancer can route a resume to
its owner from the upgrade request's URL (``?session_id=``), with no table that a balancer's restart would lose. The
resume token stays secret and in the first message; the session id is not a secret (it is in every event)."""

from __future__ import annotations

import re

REPLICA_NAME = re.compile(r"[a-z][a-z0-9]{0,15}")
"""Lowercase letters and digits, no dash: ``duplex-r1-`` is then never a prefix of another replica's ids."""

SESSION_ID_PARAM = "session_id"
"""The upgrade URL's query parameter that carries a resuming session's id (the balancer's routing key)."""
PERSIST_PARAM = "persist"
"""``persist=session_id`` in an upgrade URL: this client routes its resumes by session id, so the balancer need
not pin it to a replica by its source address (the fallback for clients that do not)."""


ADMISSION_HEADER = "x-voicechat-admission"
"""Set to ``elsewhere`` by the balancer on an upgrade it may send to another replica: without a free slot the
replica refuses the upgrade with HTTP 503 before accepting it, and the balancer retries another replica. Without the
header (a lone server, the balancer's last resort, a resume) a full replica gives the dialect's own busy answer."""
ELSEWHERE = "elsewhere"


def check_replica_name(name: str) -> str:
    if not REPLICA_NAME.fullmatch(name):
        raise ValueError(f"a replica name is 1-16 lowercase letters and digits, starting with a letter: {name!r}")
    return name


def session_id(replica: str | None, hex_digits: str) -> str:
    """A full-lane session id: ``duplex-<hex>`` on a lone server, ``duplex-<replica>-<hex>`` on a replica."""
    return f"duplex-{hex_digits}" if replica is None else f"duplex-{replica}-{hex_digits}"


def owner_of(session_id: str) -> str | None:
    """The replica a full-lane session id names, or None (a lone server's id, or not one of ours)."""
    parts = session_id.split("-")
    if len(parts) == 3 and parts[0] == "duplex" and REPLICA_NAME.fullmatch(parts[1]):
        return parts[1]
    return None
