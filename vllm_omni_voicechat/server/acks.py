"""Whether a client still takes what the server sends: the kernel's count of the bytes the peer has not yet
acknowledged (Linux ``SIOCOUTQ``), beside what the transport and the outbox still hold.

A client that stops reading is found by the transport only once the kernel's send buffer is full, which on loopback
is ~2 MiB: minutes of a quiet session's metrics events. The peer's acknowledgements stop as soon as its own receive
buffer is full, so watching them bounds the time a reader that stopped is kept."""

from __future__ import annotations

import fcntl
import struct
import termios
from typing import Any

_OUTQ = getattr(termios, "TIOCOUTQ", None)  # SIOCOUTQ on a TCP socket (Linux)


def unacked_bytes(sock: Any) -> int | None:
    """Bytes in the kernel's send queue the peer has not acknowledged (None where the kernel cannot say)."""
    if _OUTQ is None or sock is None:
        return None
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return None


class AckWatch:
    """Fed samples of a socket's byte counts (pure), says when its peer has acknowledged nothing for ``stall_s``
    while bytes waited for it."""

    __slots__ = ("stall_s", "_acked", "_since", "_idle")

    def __init__(self, stall_s: float, now: float) -> None:
        self.stall_s = stall_s
        self._acked = 0
        self._since = now
        self._idle = True

    def stalled(self, now: float, *, written: int, buffered: int, unacked: int, queued: int) -> bool:
        """``written``: bytes handed to the transport so far; ``buffered``: still in the transport; ``unacked``: in
        the kernel, not acknowledged; ``queued``: in the outbox, not yet written."""
        acked = written - buffered - unacked
        idle = buffered + unacked + queued == 0
        if acked > self._acked or idle or self._idle:  # progress, nothing waiting, or the wait starts now
            self._acked = max(acked, self._acked)
            self._since = now
            self._idle = idle
            return False
        return now - self._since >= self.stall_s
