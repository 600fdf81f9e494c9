"""Our chunk connector: vLLM-Omni's shared-memory connector whose repeated misses wait for a new chunk instead of
polling (omni/connector.py). Runs where vLLM-Omni is installed (the omni and engine venvs)."""

from __future__ import annotations

import threading
import uuid

import pytest

pytest.importorskip("vllm_omni")

from vllm_omni.distributed.omni_connectors.connectors.shm_connector import SharedMemoryConnector  # noqa: E402
from vllm_omni.distributed.omni_connectors.factory import OmniConnectorFactory  # noqa: E402
from vllm_omni.distributed.omni_connectors.utils.config import ConnectorSpec  # noqa: E402

from vllm_omni_voicechat.omni import connector as mod  # noqa: E402
from vllm_omni_voicechat.omni.connector import (  # noqa: E402
    CONNECTOR_NAME,
    ShmWrites,
    VoiceChatSharedMemoryConnector,
    register_connector,
)


def key() -> str:
    return f"vctest_{uuid.uuid4().hex[:12]}_0_0"


@pytest.fixture
def ends():
    sender, receiver = SharedMemoryConnector({"stage_id": 0}), VoiceChatSharedMemoryConnector({"stage_id": 1})
    yield sender, receiver
    sender.close()
    receiver.close()


@pytest.fixture
def asks(monkeypatch):
    """The parent's get calls (each one a look into /dev/shm)."""
    calls: list[str] = []
    parent = SharedMemoryConnector.get

    def counted(self, from_stage, to_stage, get_key, metadata=None):
        calls.append(get_key)
        return parent(self, from_stage, to_stage, get_key, metadata)

    monkeypatch.setattr(SharedMemoryConnector, "get", counted)
    return calls


def test_it_is_registered_in_vllm_omnis_connector_registry_once():
    register_connector()
    register_connector()
    assert CONNECTOR_NAME in OmniConnectorFactory.list_registered_connectors()
    made = OmniConnectorFactory.create_connector(ConnectorSpec(name=CONNECTOR_NAME, extra={"stage_id": 1}))
    try:
        assert type(made) is VoiceChatSharedMemoryConnector
    finally:
        made.close()


def test_the_packaged_cpu_deploy_yaml_names_it():
    import yaml

    from vllm_omni_voicechat.omni.local_server import CPU_DEPLOY

    connectors = yaml.safe_load(CPU_DEPLOY.read_text())["connectors"]
    assert {c["name"] for c in connectors.values()} == {CONNECTOR_NAME}


def test_a_chunk_put_by_the_parent_connector_is_got_with_its_payload(ends):
    sender, receiver = ends
    k = key()
    ok, size, _ = sender.put("0", "1", k, {"codes": [1, 2, 3]})
    assert ok and size > 0
    assert receiver.get("0", "1", k) == ({"codes": [1, 2, 3]}, size)
    assert receiver.get("0", "1", k) is None  # consumed: the segment is gone


@pytest.fixture
def waits(monkeypatch):
    """Each wait a get makes, ended at once as after RECHECK_S with nothing written meanwhile."""
    made: list[float] = []
    real_wait = ShmWrites.wait
    monkeypatch.setattr(mod, "RECHECK_S", 0.0)

    def recorded(self, timeout_s):
        made.append(timeout_s)
        return real_wait(self, 0.0)

    monkeypatch.setattr(ShmWrites, "wait", recorded)
    return made


# vLLM-Omni's adapter passes the sender's address when the request carries one; the parent then looks up by key
@pytest.mark.parametrize("meta", [None, {"source_host": "127.0.0.1", "source_port": 50151}])
def test_a_repeated_miss_waits_and_a_write_ends_the_wait_of_its_own_key(ends, asks, waits, meta):
    sender, receiver = ends
    a, b = key(), key()
    assert receiver.get("0", "1", a, meta) is None and receiver.get("0", "1", b, meta) is None
    assert (asks, len(waits)) == ([a, b], 0)  # a first miss looks at once
    assert receiver.get("0", "1", a, meta) is None
    assert (asks, len(waits)) == ([a, b, a], 1)  # a repeated one waits first (then looks anyway)
    sender.put("0", "1", b, "chunk")
    assert receiver.get("0", "1", a, meta) is None  # b's write drained: not a's, but new for us: the round goes on
    assert receiver.get("0", "1", b, meta)[0] == "chunk"  # and reaches b at once
    assert (asks[3:], len(waits)) == ([a, b], 1)
    assert receiver.get("0", "1", a, meta) is None  # our own read of b is nothing new: a waits again
    assert (asks[5:], len(waits)) == ([a], 2)
    sender.put("0", "1", a, "mine")
    assert receiver.get("0", "1", a, meta)[0] == "mine"
    assert (asks[6:], len(waits)) == ([a], 2)


def test_a_chunk_for_another_stage_or_a_file_that_is_no_chunk_ends_no_wait(ends, asks, waits):
    sender, receiver = ends
    a, other = key(), key().replace("_0_0", "_1_0")  # <request>_<from stage>_<chunk>: Stage 1's, for Stage 2
    assert receiver.get("0", "1", a) is None
    sender.put("1", "2", other, "not ours")
    with open(f"{mod.SHM_DIR}/vctest_{uuid.uuid4().hex[:8]}.tmp", "wb") as f:
        f.write(b"x")
    try:
        assert receiver.get("0", "1", a) is None
        assert (asks, len(waits)) == ([a, a], 1)
    finally:
        sender.cleanup(other)
        import os

        os.remove(f.name)


def test_a_waiting_get_wakes_when_its_chunk_is_written(ends, monkeypatch):
    sender, receiver = ends
    monkeypatch.setattr(mod, "RECHECK_S", 600.0)  # only the write can end the wait
    k = key()
    assert receiver.get("0", "1", k) is None
    got: list = []
    waiting = threading.Thread(target=lambda: got.append(receiver.get("0", "1", k)))
    waiting.start()
    sender.put("0", "1", k, b"audio")
    waiting.join(120)
    assert not waiting.is_alive() and got[0][0] == b"audio"


def test_only_a_closed_chunk_lock_file_counts_as_a_written_chunk_and_names_its_key(tmp_path):
    writes = ShmWrites(str(tmp_path))
    try:
        (tmp_path / "other.bin").write_bytes(b"x")
        assert writes.drain() == set()
        (tmp_path / "shm_req-1_0_3_lockfile.lock").write_bytes(b"")
        assert writes.drain() == {"req-1_0_3"} and writes.drain() == set()
    finally:
        writes.close()


def test_misses_are_remembered_up_to_a_bound(ends, asks, waits, monkeypatch):
    _, receiver = ends
    monkeypatch.setattr(mod, "MAX_MISSED", 2)
    a, b, c = key(), key(), key()
    for k in (a, b, c):  # a and b are left by requests that ended; the third miss forgets them
        assert receiver.get("0", "1", k) is None
    assert receiver.get("0", "1", a) is None and len(waits) == 0  # looked at once, as a first miss
    assert receiver.get("0", "1", c) is None and len(waits) == 1


def test_a_get_of_a_named_segment_never_waits(ends, asks, monkeypatch):
    sender, receiver = ends
    monkeypatch.setattr(ShmWrites, "wait", lambda self, timeout_s: pytest.fail("waited"))
    k = key()
    handle = {"shm": {"name": k, "size": 1}}
    assert receiver.get("0", "1", k, handle) is None and receiver.get("0", "1", k, {k: handle}) is None
    assert asks == [k, k]


def test_a_watch_closed_under_a_wait_ends_the_wait(tmp_path):
    writes = ShmWrites(str(tmp_path))
    writes.close()
    assert writes.drain() is None and writes.wait(600.0) is None  # look at every key


def test_without_inotify_it_polls_like_the_parent(ends, asks, monkeypatch):
    sender, receiver = ends
    warned: list[tuple] = []

    def unavailable(*_a, **_k):
        raise OSError(38, "inotify_init1 failed")

    monkeypatch.setattr(mod, "ShmWrites", unavailable)
    # our loggers may write through vLLM's handlers only (register's log_through_vllm), past pytest's capture
    monkeypatch.setattr(mod.log, "warning", lambda *args: warned.append(args))
    k = key()
    assert receiver.get("0", "1", k) is None and receiver.get("0", "1", k) is None
    assert asks == [k, k]
    assert len(warned) == 1 and "inotify unavailable" in warned[0][0]
    sender.put("0", "1", k, 7)
    assert receiver.get("0", "1", k)[0] == 7
