"""Replicas behind a real HAProxy (Debian's, scripts/install_haproxy.sh), each replica a real ``serve`` process
(``fleet/launch.py``): sessions spread, a dropped session resumes on its owner (by the id in its URL, or by its
source address for a client that does not put it there), a full fleet gives the dialect's busy answer, a draining
replica keeps its sessions and then exits, a killed replica's clients get a terminal answer at once.

Without haproxy the tests skip, unless ``VOICECHAT_REQUIRE_HAPROXY=1`` (CI) makes that a failure. HAProxy's view
of a replica (its agent-set weight, up or down) is awaited through its runtime API, never slept for."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from vllm_omni_voicechat.fleet.launch import Fleet, port_offsets
from vllm_omni_voicechat.trace.checker import TraceChecker

from .server_fixture import free_port_block

if shutil.which("haproxy") is None:
    if os.environ.get("VOICECHAT_REQUIRE_HAPROXY") == "1":
        raise RuntimeError("haproxy is required (VOICECHAT_REQUIRE_HAPROXY=1): scripts/install_haproxy.sh")
    pytest.skip("haproxy is not installed (scripts/install_haproxy.sh)", allow_module_level=True)

UPDATE = {"type": "session.update", "session": {"instructions": "Be brief."}}
WAIT_S = 20.0  # bound on awaited conditions (HAProxy checks every 0.5-1 s)
OURS = "/v1/duplex?persist=session_id"  # our clients: resumes routed by session id
STOCK = "/v1/realtime?duplex=1&model=sim&autostart=0"  # a stock DuplexClient's URL, first connect and resume alike


def fleet(n: int = 2, max_sessions: int = 2) -> Fleet:
    return Fleet(n, free_port_block(port_offsets(n)), serve_args=["--max-sessions", str(max_sessions), "--disconnect-grace-s", "20"],
                 agent_interval_ms=200, check_interval_ms=500)


def until(condition: Callable[[], object], what: str) -> object:
    deadline = time.monotonic() + WAIT_S
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S:g} s: {what}")
        time.sleep(0.05)  # ok: awaiting HAProxy's next check (another process)
    return value


def weight(f: Fleet, name: str) -> int:
    return int(f.runtime(f"get weight voicechat/{name}").split()[0])


def server_up(f: Fleet, name: str) -> bool:
    for line in f.runtime("show servers state voicechat").splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[3] == name:
            return fields[5] == "2"  # srv_op_state 2: running
    return False


class Session:
    """One tiered full-lane session through the proxy: its socket, session.created, the last seq it saw. Every frame
    goes through the trace checker, per socket and as the client's de-duplicated view across resumes (no event lost
    or duplicated over the drops); ``checked`` fails the test on any violation."""

    def __init__(self, f: Fleet, path: str = OURS, source: str = "127.0.0.1") -> None:
        self.f, self.path, self.source = f, path, source
        self.seq = 0
        self.view = TraceChecker("tiered", stream="session", name="client view")
        self.checkers: list[TraceChecker] = []
        self.seen_created = False
        self.ws = self._connect(path)
        self.send(UPDATE)
        self.created = self.recv_type("session.created")
        self.recv_type("session.updated")
        OPENED.append(self)

    @property
    def id(self) -> str:
        return self.created["session"]["id"]

    @property
    def replica(self) -> str:
        return self.id.split("-")[1]

    def _connect(self, path: str) -> ClientConnection:
        self.checkers.append(TraceChecker("tiered", name=f"socket {len(self.checkers) + 1}"))
        return connect(self.f.url + path, open_timeout=10, ping_interval=None, max_size=None, proxy=None,
                       source_address=(self.source, 0))

    def send(self, event: dict, *, view: bool = True) -> None:
        frame = json.dumps(event)
        self.checkers[-1].client_event(frame)
        if view:
            self.view.client_event(frame)
        self.ws.send(frame)

    def recv(self) -> dict:
        text = self.ws.recv(timeout=10)
        self.checkers[-1].server_event(text)
        event = json.loads(text)
        seq = event.get("server_event_seq")
        if seq is not None and seq > self.seq:  # the client de-duplicates by seq, as DuplexClient does
            self.seq = seq
            self.view.server_event(text)
        elif event["type"] == "session.created" and not self.seen_created:
            self.seen_created = True
            self.view.server_event(text)
        return event

    def recv_type(self, type_: str) -> dict:
        while (event := self.recv())["type"] != type_:
            assert event["type"] != "error", event
        return event

    def heartbeat(self) -> None:
        self.send({"type": "session.heartbeat"})
        self.recv_type("session.heartbeat_ack")

    def drop(self) -> None:
        """The transport fails under the session (no close handshake)."""
        self.ws.socket.shutdown(2)
        self.ws.close()
        self.checkers[-1].transport_closed(None)

    def lost(self) -> None:
        """The server's side went away (a killed replica): whatever was in flight, then the end."""
        with pytest.raises((ConnectionClosed, OSError)):
            while True:
                self.recv()
        self.checkers[-1].transport_closed(None)

    def resume(self, *, by_id: bool = True) -> dict:
        path = f"{self.path}&session_id={self.id}" if by_id else self.path
        self.ws = self._connect(path)
        self.send({"type": "session.resume", "session_id": self.id, "resume_token": self.created["resume_token"],
                   "last_received_server_event_seq": self.seq}, view=False)
        answer = self.recv()
        if answer["type"] == "session.resumed":
            self.created["resume_token"] = answer["resume_token"]
        else:
            with pytest.raises(ConnectionClosed) as closed:
                self.recv()
            self.checkers[-1].transport_closed(closed.value.rcvd.code if closed.value.rcvd else None)
        return answer

    def close(self) -> None:
        self.send({"type": "session.close"})
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                self.recv()
        code = closed.value.rcvd.code if closed.value.rcvd else None
        self.checkers[-1].transport_closed(code)
        self.view.transport_closed(code)

    def violations(self) -> list[str]:
        return [f"{c.name}: {v}" for c in (*self.checkers, self.view) for v in c.violations]


OPENED: list[Session] = []


@pytest.fixture(autouse=True)
def checked() -> Iterator[None]:
    """Every session a test opened passes the trace checker on every socket and in its client view."""
    OPENED.clear()
    yield
    found = [f"session {s.created.get('session', {}).get('id')}: {v}" for s in OPENED for v in s.violations()]
    OPENED.clear()
    assert not found, "\n".join(found)


@pytest.fixture(scope="module")
def two() -> Iterator[Fleet]:
    with fleet() as f:
        yield f


def test_sessions_spread_and_every_dropped_session_resumes_on_its_owner(two):
    sessions = [Session(two) for _ in range(4)]
    assert sorted(s.replica for s in sessions) == ["r1", "r1", "r2", "r2"]
    for round_ in range(5):
        for s in sessions:
            s.drop()
            answer = s.resume()
            assert answer["type"] == "session.resumed", (round_, answer)
            s.heartbeat()
    for s in sessions:
        s.close()
    until(lambda: weight(two, "r1") > 0 and weight(two, "r2") > 0, "both replicas have room again")


def test_a_stock_client_is_pinned_by_its_source_address_and_resumes(two):
    pinned = [Session(two, STOCK, source=f"127.0.0.{i}") for i in (2, 3)]
    for s in pinned:
        for _ in range(3):
            s.drop()
            answer = s.resume(by_id=False)
            assert answer["type"] == "session.resumed", answer
    table = two.runtime("show table voicechat")
    assert "key=127.0.0.2" in table and "key=127.0.0.3" in table
    for s in pinned:
        s.close()


def test_a_full_fleet_gives_the_dialects_busy_answer_and_resumes_still_reach_their_owners(two):
    sessions = [Session(two) for _ in range(4)]
    until(lambda: weight(two, "r1") == 0 and weight(two, "r2") == 0, "both replicas report no free slot")
    busy = connect(two.url + "/v1/voicechat", open_timeout=10, proxy=None)
    error = json.loads(busy.recv(timeout=10))
    assert error["type"] == "error" and error["error"]["code"] == "server_busy"
    with pytest.raises(ConnectionClosed) as closed:
        busy.recv(timeout=10)
    assert closed.value.rcvd.code == 1013
    tiered = connect(two.url + OURS, open_timeout=10, proxy=None)
    tiered.send(json.dumps(UPDATE))
    assert json.loads(tiered.recv(timeout=10))["error"]["code"] == "resource_exhausted"
    sessions[0].drop()
    assert sessions[0].resume()["type"] == "session.resumed"  # a full replica still takes its own resume
    for s in sessions:
        s.close()
    until(lambda: weight(two, "r1") > 0 and weight(two, "r2") > 0, "both replicas have room again")


def test_a_draining_replica_keeps_its_sessions_takes_no_new_one_and_exits_when_they_end():
    with fleet() as f:
        kept = Session(f)
        draining, other = kept.replica, {"r1": "r2", "r2": "r1"}[kept.replica]
        f.processes[draining].send_signal(signal.SIGTERM)
        until(lambda: weight(f, draining) == 0, "the replica reports it drains")
        newcomers = [Session(f) for _ in range(2)]
        assert [s.replica for s in newcomers] == [other, other]
        kept.drop()
        assert kept.resume()["type"] == "session.resumed"  # a draining replica still resumes its own
        kept.heartbeat()
        assert f.processes[draining].poll() is None
        kept.close()
        f.processes[draining].wait(timeout=WAIT_S)  # it exits once its last session has ended
        for s in newcomers:
            s.heartbeat()
            s.close()


def test_a_killed_replicas_clients_get_a_terminal_answer_at_once_and_the_others_are_untouched():
    with fleet() as f:
        lost, other = Session(f), Session(f)
        assert {lost.replica, other.replica} == {"r1", "r2"}
        f.processes[lost.replica].kill()
        f.processes[lost.replica].wait()
        lost.lost()
        # A typed, terminal answer (within Session.recv's 10 s; waiting would have ended in the 30 s handshake timeout)
        answer = lost.resume()
        assert answer["type"] == "error" and answer["error"]["code"] == "session_resume_expired", answer
        assert f"belongs to replica {lost.replica}, not to this replica {other.replica}" in answer["error"]["message"]
        until(lambda: not server_up(f, lost.replica), "HAProxy takes the killed replica out")
        other.heartbeat()
        other.close()


def test_a_rolling_restart_of_every_replica_loses_no_session():
    """Each replica in turn: drained (SIGTERM), its sessions go on until their clients end them while new ones go to
    the other, it exits, it is started again and HAProxy takes it back."""
    with fleet() as f:
        sessions = [Session(f), Session(f)]
        assert {s.replica for s in sessions} == {"r1", "r2"}
        for replica in f.replicas:
            name = replica.name
            f.processes[name].send_signal(signal.SIGTERM)
            until(lambda: weight(f, name) == 0, f"{name} reports it drains")
            newcomer = Session(f)
            assert newcomer.replica != name
            sessions.append(newcomer)
            for s in [s for s in sessions if s.replica == name]:
                s.drop()
                assert s.resume()["type"] == "session.resumed"  # still its owner's while it drains
                s.heartbeat()
                s.close()  # the client ends it
                sessions.remove(s)
            f.processes[name].wait(timeout=WAIT_S)
            f.start_replica(replica)
            f.wait_healthy(replica)
            until(lambda: server_up(f, name) and weight(f, name) > 0, f"HAProxy takes {name} back")
        assert len(sessions) == 1
        for s in sessions:
            s.heartbeat()
            s.close()
