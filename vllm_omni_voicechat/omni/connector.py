"""Chunks between stages through vLLM-Omni's shared-memory connector, received without polling.

vLLM-Omni's chunk adapter receives on a thread of its own: every round it asks the connector for the next chunk of
each request that waits for one, and when none was there it waits 1 ms and asks again
(``transfer_adapter/base.py:79-82`` in 0.30.0). Each miss of ``SharedMemoryConnector`` opens a shared-memory segment
that does not exist yet, so while sessions are open Stages 1 and 2 each ask ~1,000 times a second per waiting
request (``benchmarks/engine_idle.py``: ~0.07 cores per stage with four idle sessions).

``VoiceChatSharedMemoryConnector`` is that connector (same segments, same lock files, same payloads) with one
change to ``get``: once it has asked for a key and found nothing, it asks again only after a chunk from the same
stage was written to ``/dev/shm`` (inotify: a sender closes a chunk's lock file, named by its key, when the chunk
is complete), or after ``RECHECK_S`` at the latest (a lost event). The adapter still calls
``get`` for each waiting request in turn; the call that would only repeat a miss blocks instead, so a round with
nothing new costs one wait, not a syscall per request per millisecond. Where inotify is unavailable it is the parent.

Registered under ``CONNECTOR_NAME`` through ``OmniConnectorFactory.register_connector`` (the seam vLLM-Omni offers
for connectors); the deploy YAMLs name it. Linux only, stdlib only (``ctypes`` for inotify).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import select
import struct
import time
from typing import Any

from vllm_omni.distributed.omni_connectors.connectors.shm_connector import SharedMemoryConnector

log = logging.getLogger(__name__)

CONNECTOR_NAME = "VoiceChatSharedMemoryConnector"
SHM_DIR = "/dev/shm"
RECHECK_S = 0.01
"""The longest a repeated miss waits for a new write before asking again anyway."""
MAX_MISSED = 4096
"""Misses remembered at most (a request that ends while waiting leaves its key; forgetting one costs one look)."""
LOCK_PREFIX, LOCK_SUFFIX = b"shm_", b"_lockfile.lock"
"""A chunk's lock file (``shm_<key>_lockfile.lock``): its sender closes it once the segment is written."""

_IN_CLOSE_WRITE = 0x00000008
_IN_Q_OVERFLOW = 0x00004000
_EVENT = struct.Struct("iIII")


class ShmWrites:
    """Chunks completed in ``/dev/shm``, by key, through an inotify descriptor (non-blocking)."""

    def __init__(self, directory: str = SHM_DIR) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        if libc.inotify_add_watch(fd, os.fsencode(directory), _IN_CLOSE_WRITE) < 0:
            errno = ctypes.get_errno()
            os.close(fd)
            raise OSError(errno, f"inotify_add_watch({directory}) failed")
        self.fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def drain(self) -> set[str] | None:
        """The keys whose lock files were closed since the last drain (a segment's own descriptor closes before its
        lock file, so a key here is complete); None when events were lost or the watch is gone: look at every key."""
        keys: set[str] = set()
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return keys
            except OSError:  # closed under a waiting get (the connector's close at shutdown)
                return None
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, mask, _, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if mask & _IN_Q_OVERFLOW:
                    return None
                if name.startswith(LOCK_PREFIX) and name.endswith(LOCK_SUFFIX):
                    keys.add(os.fsdecode(name[len(LOCK_PREFIX):-len(LOCK_SUFFIX)]))

    def wait(self, timeout_s: float) -> set[str] | None:
        """Block until some chunk completes (its keys), events are lost (None), or ``timeout_s`` passes (empty)."""
        deadline = time.monotonic() + timeout_s
        while not (keys := self.drain()) and keys is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not self._poll.poll(left * 1000.0):
                return set()
        return keys

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


class VoiceChatSharedMemoryConnector(SharedMemoryConnector):
    """``SharedMemoryConnector`` whose repeated misses wait for their chunk instead of polling (module docstring)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self._writes: ShmWrites | None = None
        self._watching = True
        self._missed: set[str] = set()
        """Keys asked for and not found, whose chunk has not been written since: asking again would miss again."""
        self._got: set[str] = set()
        """Keys read, until their lock file's close (our own read's) is seen."""

    def _watch(self) -> ShmWrites | None:
        # Created on the first get, in the receiving thread's process (never inherited across a fork).
        if self._writes is None and self._watching:
            try:
                self._writes = ShmWrites()
                log.info("voicechat connector: stage %s receives chunks on inotify writes, not by polling",
                         self.stage_id)
            except (OSError, AttributeError) as exc:
                self._watching = False
                log.warning("inotify unavailable (%s): chunks are polled as vLLM-Omni's connector does", exc)
        return self._writes

    def _written(self, keys: set[str] | None, from_stage: str) -> bool:
        """Note the chunks completed since the last look; True when one is for us and not yet got: a key that
        missed (it is no longer a miss) or a key not asked for yet (a request the adapter began receiving)."""
        if keys is None:
            self._missed.clear()
            self._got.clear()
            return True
        ours = {k for k in keys if k.rsplit("_", 2)[-2:-1] == [from_stage]}  # <request>_<from stage>_<chunk>
        fresh = ours - self._got  # our own read of a chunk closes its lock file too
        self._got -= ours
        self._missed -= fresh
        return bool(fresh)

    def get(self, from_stage: str, to_stage: str, get_key: str, metadata=None) -> tuple[Any, int] | None:
        writes = None if _addresses_segment(metadata, get_key) else self._watch()
        if writes is not None:
            if not self._written(writes.drain(), from_stage) and get_key in self._missed:
                # Nothing for us was written since this key missed: wait until something is (the adapter's round
                # then reaches it), or until RECHECK_S, then look anyway.
                deadline = time.monotonic() + RECHECK_S
                while not self._written(writes.wait(max(0.0, deadline - time.monotonic())), from_stage):
                    if time.monotonic() >= deadline:
                        break
        result = super().get(from_stage, to_stage, get_key, metadata)
        if writes is not None:
            if result is None:
                if len(self._missed) >= MAX_MISSED:  # keys of requests that ended before their chunk: forget them
                    self._missed.clear()
                self._missed.add(get_key)
            else:
                self._missed.discard(get_key)
                self._got.add(get_key)
        return result

    def close(self) -> None:
        writes, self._writes = getattr(self, "_writes", None), None
        if writes is not None:
            writes.close()
        super().close()


def _addresses_segment(metadata: Any, key: str) -> bool:
    """Whether the parent reads a segment named by ``metadata`` (no lookup by key, so no miss to repeat): as
    ``SharedMemoryConnector.get`` decides. Other metadata (a sender's address) falls back to the key."""
    if isinstance(metadata, dict) and key in metadata:
        metadata = metadata[key]
    return isinstance(metadata, dict) and "shm" in metadata


def register_connector() -> None:
    """Add ours to vLLM-Omni's connector registry (idempotent; in every process that builds connectors)."""
    from vllm_omni.distributed.omni_connectors.factory import OmniConnectorFactory

    if CONNECTOR_NAME not in OmniConnectorFactory.list_registered_connectors():
        OmniConnectorFactory.register_connector(CONNECTOR_NAME, VoiceChatSharedMemoryConnector)


__all__ = ["CONNECTOR_NAME", "RECHECK_S", "ShmWrites", "VoiceChatSharedMemoryConnector", "register_connector"]
