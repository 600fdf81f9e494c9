"""The replica's side of a fleet: owner-bearing session ids, HAProxy's agent line, admission that drains, the
shipped HAProxy configuration, and a replica's answers (503 before the accept when the balancer may try another,
the dialect's busy answer otherwise, a wrong owner's resume refused at once)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from vllm_omni_voicechat.fleet.agent import agent_reply, serve_agent
from vllm_omni_voicechat.fleet.haproxy import haproxy_config
from vllm_omni_voicechat.fleet.keys import check_replica_name, owner_of, session_id
from vllm_omni_voicechat.fleet.launch import replica_addresses
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.server.admission import Admission

from .server_fixture import RawClient, free_port, running_app

ROOT = Path(__file__).resolve().parents[1]
ELSEWHERE = {"X-Voicechat-Admission": "elsewhere"}
UPDATE = {"type": "session.update", "session": {}}


# ------------------------------------------------------------------------------------------------ pure parts


@given(st.from_regex(r"[a-z][a-z0-9]{0,15}", fullmatch=True), st.binary(min_size=16, max_size=16))
def test_a_replica_session_id_names_its_owner(replica, raw):
    sid = session_id(replica, raw.hex())
    assert sid == f"duplex-{replica}-{raw.hex()}"
    assert owner_of(sid) == replica
    assert owner_of(session_id(None, raw.hex())) is None  # a lone server's id names nobody


@pytest.mark.parametrize("bad", ["", "R1", "r-1", "1r", "r_1", "a" * 17, "r1 "])
def test_replica_names_are_lowercase_letters_and_digits(bad):
    with pytest.raises(ValueError, match="replica name"):
        check_replica_name(bad)


@pytest.mark.parametrize("sid", ["duplex-nope", "sess_abc", "duplex-R1-00", "duplex--00", "x-r1-00", "duplex-r1-a-b"])
def test_ids_that_name_no_replica(sid):
    assert owner_of(sid) is None


def test_agent_line_weight_follows_free_slots_and_drain():
    assert agent_reply(1, False) == "100%\n"
    assert agent_reply(0, False) == "0%\n"
    assert agent_reply(3, True) == "0%\n"


def test_agent_answers_one_line_per_connection():
    async def main():
        lines = iter(["100%\n", "0%\n"])
        server = await serve_agent("127.0.0.1", 0, lambda: next(lines))
        port = server.sockets[0].getsockname()[1]
        got = []
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            got.append(await reader.read())  # to EOF: the agent closes after its line
            writer.close()
        server.close()
        return got

    assert asyncio.run(main()) == [b"100%\n", b"0%\n"]


def test_draining_admission_takes_no_new_session_and_empties_its_queue():
    changes = []
    admission = Admission(2, queue_capacity=2)
    held = admission.try_acquire()
    assert admission.try_acquire() is not None and admission.free == 0
    ticket = admission.enqueue(lambda: changes.append("queued"))
    assert ticket is not None and ticket.position == 1
    admission.drain()
    assert ticket.position == -1 and changes == ["queued"] and not admission.waiting
    held.release()
    assert admission.active == 1 and admission.free == 0  # a freed slot takes nobody new
    assert admission.try_acquire() is None and admission.enqueue(lambda: None) is None


def test_shipped_haproxy_config_is_the_generated_one_for_three_replicas():
    shipped = (ROOT / "deploy/haproxy/haproxy.cfg").read_text()
    assert shipped == haproxy_config(replica_addresses(3, 8000))


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed (scripts/install_haproxy.sh)")
def test_haproxy_accepts_the_shipped_config():
    done = subprocess.run(["haproxy", "-c", "-f", str(ROOT / "deploy/haproxy/haproxy.cfg")], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------------------------------------ a replica


def refused_status(url: str, headers: dict) -> int:
    with pytest.raises(InvalidStatus) as refused:
        connect(url, additional_headers=headers, open_timeout=10)
    return refused.value.response.status_code


@pytest.mark.parametrize("path", ["/v1/voicechat", "/v1/realtime", "/v1/duplex", "/v1/realtime?model=sim"])
def test_a_full_replica_refuses_the_upgrade_when_the_balancer_may_try_another(path):
    with running_app(ServerConfig.simulator(max_sessions=1, replica="r1")) as (url, server):
        holder = RawClient(url + "/v1/voicechat")
        holder.recv_type("session.created")
        with pytest.raises(InvalidStatus) as refused:
            connect(url + path, additional_headers=ELSEWHERE, open_timeout=10)
        response = refused.value.response
        assert response.status_code == 503 and response.headers["Retry-After"] == "1"
        assert json.loads(response.body) == {"error": {"code": "server_busy", "message": "no free session slot"}}
        assert server.usage.rejected[("v3" if "voicechat" in path or path == "/v1/realtime" else "tiered",
                                      "elsewhere")] == 1
        # Without the header (a lone server, the balancer's last resort) the dialect's own busy answer
        busy = RawClient(url + "/v1/voicechat")
        assert busy.recv()["error"]["code"] == "server_busy" and busy.close_code() == 1013
        holder.close()


def test_a_replica_with_a_slot_takes_the_session_with_the_header_and_names_itself_in_full_lane_ids():
    with running_app(ServerConfig.simulator(max_sessions=1, replica="r7")) as (url, server):
        ws = connect(url + "/v1/duplex", additional_headers=ELSEWHERE, open_timeout=10)
        ws.send(json.dumps(UPDATE))
        created = json.loads(ws.recv(timeout=10))
        assert created["type"] == "session.created" and created["session"]["id"].startswith("duplex-r7-")
        assert len(created["session"]["id"]) == len("duplex-r7-") + 32
        assert server.admission.active == 1
        ws.close()


def test_a_draining_replica_refuses_new_sessions_and_says_so_in_health():
    import urllib.request

    with running_app(ServerConfig.simulator(max_sessions=2, replica="r1")) as (url, server):
        server.drain()
        assert refused_status(url + "/v1/voicechat", ELSEWHERE) == 503
        busy = RawClient(url + "/v1/duplex")
        busy.send(UPDATE)
        err = busy.recv()
        assert err["error"]["code"] == "resource_exhausted" and "draining" in err["error"]["message"]
        health = json.loads(urllib.request.urlopen(url.replace("ws://", "http://") + "/health").read())
        assert health["status"] == "ready"  # draining is not a failure: resumes must still be routed here
        assert health["replica"] == {"name": "r1", "draining": True, "free_slots": 0}
        assert server.agent_reply() == "0%\n"


def test_a_resume_for_another_replica_is_refused_at_once_naming_the_owner():
    with running_app(ServerConfig.simulator(replica="r1")) as (url, _):
        c = RawClient(url + "/v1/duplex")
        c.send({"type": "session.resume", "event_id": "r1", "session_id": "duplex-r2-" + "0" * 32,
                "resume_token": "rt_x", "last_received_server_event_seq": 0})
        err = c.recv()["error"]
        assert err["code"] == "session_resume_expired" and err["event_id"] == "r1"
        assert "replica r2, not to this replica r1" in err["message"]
        assert c.close_code() == 1000


def test_the_agent_port_serves_the_replica_state():
    port = free_port()
    with running_app(ServerConfig.simulator(max_sessions=1, replica="r1", agent_port=port)) as (url, _):
        import socket

        def line() -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                return s.recv(64)

        assert line() == b"100%\n"
        holder = RawClient(url + "/v1/voicechat")
        holder.recv_type("session.created")
        assert line() == b"0%\n"
        holder.close()


def test_a_detached_session_holds_its_slot_in_the_agents_line():
    """A tiered session whose transport dropped waits for its resume holding its slot: the replica is still full."""
    with running_app(ServerConfig.simulator(max_sessions=1, replica="r1", disconnect_grace_s=30.0)) as (url, server):
        c = RawClient(url + "/v1/duplex")
        c.send(UPDATE)
        c.recv_type("session.created")
        c.ws.socket.shutdown(2)  # the transport fails: the session detaches
        c.ws.close()
        record = next(iter(server.live.hosted()))
        deadline = time.monotonic() + 10
        while getattr(record.protocol, "detached_at", None) is None:  # awaited: the server sees the drop
            assert time.monotonic() < deadline, "the session never detached"
            time.sleep(0.01)  # ok: waiting for the server's thread
        assert server.admission.active == 1 and server.admission.free == 0
        assert server.agent_reply() == "0%\n"
