"""vLLM-Omni's own ``DuplexClient`` (unmodified) and our ``ResumingDuplexClient`` through HAProxy in front of two
simulator replicas (real processes, ``fleet/launch.py``): our client's sessions spread and each resumes on its owner
after its transport is cut (its URL carries the session id); a stock ``DuplexClient`` resumes from the same source
address (pinned by HAProxy); a stock client whose resume reaches another replica gets the final answer at once.

Skipped where vllm-omni or haproxy is missing (``VOICECHAT_REQUIRE_HAPROXY=1`` makes the latter a failure); CI runs
it in the CPU vLLM-Omni venv."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil

import pytest

from vllm_omni_voicechat.fleet.launch import Fleet, port_offsets

from .compat import CuttableTransport
from .server_fixture import free_port_block

if importlib.util.find_spec("vllm_omni") is None:
    pytest.skip("vllm_omni is not installed (scripts/install_omni_cpu.sh)", allow_module_level=True)
if shutil.which("haproxy") is None:
    if os.environ.get("VOICECHAT_REQUIRE_HAPROXY") == "1":
        raise RuntimeError("haproxy is required (VOICECHAT_REQUIRE_HAPROXY=1): scripts/install_haproxy.sh")
    pytest.skip("haproxy is not installed (scripts/install_haproxy.sh)", allow_module_level=True)

from vllm_omni.clients import duplex as dc  # noqa: E402

from vllm_omni_voicechat.omni.client_preset import ResumingDuplexClient  # noqa: E402


def connector(source: str, urls: list[str], transports: list[CuttableTransport]):
    async def connect(url: str) -> CuttableTransport:
        import websockets

        urls.append(url)
        transports.append(CuttableTransport(await websockets.connect(url, max_size=64 << 20, local_addr=(source, 0))))
        return transports[-1]

    return connect


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


@pytest.fixture(scope="module")
def fleet():
    with Fleet(2, free_port_block(port_offsets(2)), serve_args=["--max-sessions", "2", "--disconnect-grace-s", "20"],
               agent_interval_ms=200, check_interval_ms=500) as f:
        yield f


POLICY = dict(max_attempts=5, backoff_s=(0.05, 0.2))


def test_our_clients_spread_and_each_resumes_on_its_owner(fleet):
    async def main():
        out = []
        clients = []
        for _ in range(4):
            urls: list[str] = []
            transports: list[CuttableTransport] = []
            c = ResumingDuplexClient(fleet.url + "/v1/realtime", model="sim", heartbeat_interval_s=None,
                                     reconnect=dc.ReconnectPolicy(**POLICY),
                                     connect=connector("127.0.0.1", urls, transports))
            await c.__aenter__()
            clients.append((c, urls, transports))
        for c, urls, transports in clients:
            first_id = c.session_id
            for _ in range(2):
                resumed = asyncio.ensure_future(c.wait_for("connection.resumed", timeout_s=30))
                await asyncio.sleep(0)  # ok: a yield, so the waiter is listening before the cut
                transports[-1].cut()
                await resumed
            out.append((first_id, c.session_id, list(urls)))
        for c, _, _ in clients:
            await c.close()
        return out

    rows = run(main())
    assert sorted(first.split("-")[1] for first, _, _ in rows) == ["r1", "r1", "r2", "r2"]
    for first, now, urls in rows:
        assert now == first and len(urls) == 3  # the same session, on its owner, after each cut
        assert all(f"&session_id={first}" in u for u in urls[1:]) and "&session_id=" not in urls[0]


def test_a_stock_duplex_client_resumes_from_the_same_source_address(fleet):
    async def main():
        urls: list[str] = []
        transports: list[CuttableTransport] = []
        c = dc.DuplexClient(fleet.url, model="sim", heartbeat_interval_s=None, reconnect=dc.ReconnectPolicy(**POLICY),
                            connect=connector("127.0.0.9", urls, transports))
        async with c:
            first_id = c.session_id
            resumed = asyncio.ensure_future(c.wait_for("connection.resumed", timeout_s=30))
            await asyncio.sleep(0)  # ok: a yield, so the waiter is listening before the cut
            transports[-1].cut()
            await resumed
            return first_id, c.session_id, urls

    first, now, urls = run(main())
    assert now == first and len(urls) == 2 and urls[0] == urls[1]  # no routing key: pinned by its address
    assert "session_id" not in urls[1] and "persist" not in urls[1]


def test_a_stock_client_of_a_killed_replica_gets_a_final_answer_on_its_first_attempt(fleet):
    """Last in the module (it kills a replica): the client's pin names a dead server, HAProxy sends its resume to
    the other replica, whose typed session_resume_expired DuplexClient takes as final: one attempt, no backoff
    through its five."""

    async def main():
        urls: list[str] = []
        transports: list[CuttableTransport] = []
        c = dc.DuplexClient(fleet.url, model="sim", heartbeat_interval_s=None, reconnect=dc.ReconnectPolicy(**POLICY),
                            connect=connector("127.0.0.20", urls, transports))
        closed: list[str] = []
        await c.__aenter__()
        owner = c.session_id.split("-")[1]
        process = fleet.processes[owner]
        process.kill()
        await asyncio.get_running_loop().run_in_executor(None, process.wait)
        try:
            await c.wait_for("connection.resumed", timeout_s=60)
        except Exception as exc:  # the client ended: its resume was refused as final
            closed.append(type(exc).__name__)
        await c.close()
        return owner, closed, urls

    owner, closed, urls = run(main())
    assert closed == ["DuplexSessionClosedError"] and len(urls) == 2, (owner, closed, urls)  # one resume attempt
