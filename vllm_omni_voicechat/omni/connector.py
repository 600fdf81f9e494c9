"""Chunks between stages through vLLM-Omni's shared-memory connector, received without polling.

vLLM-Omni's chunk adapter receives on a thread of its own: every round it asks the connector for the next chunk of
each request that waits for one, and when none was there it waits 1 ms and asks again
(``transfer_adapter/base.py:79-82`` in 0.30.0). Each miss of ``SharedMemoryConnector`` opens a shared-memory segment
that does not exist yet, so while sessions are open Stages 1 and 2 each ask ~1,000 times a second per waiting
request (measured: ~0.055 cores per stage with four idle sessions).

``VoiceChatSharedMemoryConnector`` is that connector (same segments, same lock files, same payloads) with one
change to ``get``: once it has asked for a key and found nothing, it asks again only after something new was
written to ``/dev/shm`` (inotify: a sender closes a chunk's lock file when the chunk is complete), or after
``RECHECK_S`` at the latest (a lost event, a request the adapter began polling meanwhile). The adapter still calls
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
LOCK_SUFFIX = b"_lockfile.lock"
"""A chunk's lock file (``shm_<key>_lockfile.lock``): its sender closes it once the segment is written."""

_IN_CLOSE_WRITE = 0x00000008
_IN_Q_OVERFLOW = 0x00004000
_EVENT = struct.Struct("iIII")


class ShmWrites:
    """Completed writes in ``/dev/shm``, through an inotify descriptor (non-blocking)."""

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

    def drain(self) -> bool:
        """Read every pending event; True when a chunk's lock file was closed after a write (or events were lost)."""
        seen = False
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return seen
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, mask, _, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if mask & _IN_Q_OVERFLOW or name.endswith(LOCK_SUFFIX):
                    seen = True

    def wait(self, timeout_s: float) -> bool:
        """Block until a chunk's write completes (True) or ``timeout_s`` passes (False). Other writes (a segment's own
        descriptor closes before its lock file does) do not end the wait."""
        deadline = time.monotonic() + timeout_s
        while not self.drain():
            left = deadline - time.monotonic()
            if left <= 0 or not self._poll.poll(left * 1000.0):
                return False
        return True

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


class VoiceChatSharedMemoryConnector(SharedMemoryConnector):
    """``SharedMemoryConnector`` whose repeated misses wait for a new chunk instead of polling (module docstring)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self._writes: ShmWrites | None = None
        self._watching = True
        self._missed: set[str] = set()
        """Keys asked for and not found since the last completed write: asking again would repeat the miss."""

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

    def get(self, from_stage: str, to_stage: str, get_key: str, metadata=None) -> tuple[Any, int] | None:
        writes = None if _addresses_segment(metadata, get_key) else self._watch()
        if writes is not None:
            if writes.drain():
                self._missed.clear()
            if get_key in self._missed and writes.wait(RECHECK_S):
                self._missed.clear()
        result = super().get(from_stage, to_stage, get_key, metadata)
        if writes is not None:
            if result is None:
                self._missed.add(get_key)
            else:
                self._missed.discard(get_key)
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
