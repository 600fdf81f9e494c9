"""HAProxy's agent check (its configuration manual, "agent-check"): HAProxy connects to a replica's agent port
every ``agent-inter`` and reads one line. Ours says whether the replica takes new sessions: weight ``100%`` with a
free slot, ``0%`` when every slot is held (detached sessions waiting for a resume hold theirs) or the replica
drains. Weight 0 takes a server out of load balancing while sessions routed to it by id still reach it; with every
replica at 0 HAProxy sends new sessions to the backup lines, where the dialect's own busy answer is given.

The agent never says ``ready`` / ``drain`` (administrative states): those are the operator's, through HAProxy's
runtime API, and an agent's word would undo theirs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

log = logging.getLogger("vllm_omni_voicechat.fleet")


def agent_reply(free_slots: int, draining: bool) -> str:
    """The agent's line for HAProxy."""
    return "100%\n" if free_slots > 0 and not draining else "0%\n"


async def serve_agent(host: str, port: int, reply: Callable[[], str]) -> asyncio.Server:
    """Answer every connection with ``reply()`` and close it (HAProxy reads up to the first newline)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            writer.write(reply().encode("ascii"))
            await writer.drain()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    server = await asyncio.start_server(answer, host, port)
    log.info("HAProxy agent on %s:%d", host, port)
    return server
