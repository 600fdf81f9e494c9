"""How fast one socket is read: a byte budget, and the transport's reading held while it is overdrawn.

Every byte a client sends costs the loop that all sessions share (unmasking, decoding, counting, parsing: a 15 MB
message is ~30 ms of one core). The frame and message limits bound one message, not how many come: a client sending
15 MB messages back to back kept the loop busy parsing and the sessions beside it late. So a socket's reading is
budgeted: ``INBOUND_BYTES_PER_S`` on average, a burst of up to ``INBOUND_BURST_BYTES``; past it, reading waits until
the budget is back to zero and the client meets TCP backpressure, as it would on a slow link. No legitimate client is
near it: real-time audio is ~43 KB/s as tiered JSON, ~55 KB/s as v3, and the largest message (a tiered frame of
15 MiB) fits the burst.
"""

from __future__ import annotations

import asyncio
from typing import Any

INBOUND_BYTES_PER_S = 4 << 20
"""A socket's average read rate (bytes a second, WebSocket framing included)."""
INBOUND_BURST_BYTES = 17 << 20
"""What a socket may read at once after a quiet spell: the largest tiered message (16 MiB) and then some."""


class ByteBudget:
    """A token bucket over bytes read (pure: time is injected)."""

    __slots__ = ("rate", "burst", "balance", "at")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("a byte budget's rate and burst must be positive")
        self.rate = rate
        self.burst = burst
        self.balance = float(burst)
        self.at = now

    def spend(self, n: int, now: float) -> float:
        """Charge ``n`` bytes read at ``now``; the seconds until the balance is back to zero (0.0: not overdrawn)."""
        if now > self.at:
            self.balance = min(self.burst, self.balance + (now - self.at) * self.rate)
            self.at = now
        self.balance -= n
        return 0.0 if self.balance >= 0 else -self.balance / self.rate


class GatedReading:
    """A transport as its protocol sees it, with one more reason to stop reading: a hold (the byte budget). Reading
    resumes only once neither the protocol's readers (``pause_reading``/``resume_reading``, uvicorn's and ours) nor a
    hold keep it paused. Everything else is the transport's own."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._paused = False  # by a reader
        self._held: asyncio.TimerHandle | None = None
        self.holds = 0
        """How many times reading was held (telemetry and tests)."""
        self.write = transport.write  # the hot path: no delegation per call

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def pause_reading(self) -> None:
        self._paused = True
        if self._held is None:
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._paused = False
        if self._held is None:
            self._transport.resume_reading()

    def hold(self, seconds: float) -> None:
        """Read nothing for ``seconds`` (a hold already running ends at the later of the two)."""
        at = self._loop.time() + seconds
        if self._held is not None:
            if self._held.when() >= at:
                return
            self._held.cancel()
        elif not self._paused:
            self._transport.pause_reading()
        self.holds += 1
        self._held = self._loop.call_at(at, self._release)

    def _release(self) -> None:
        self._held = None
        if not self._paused and not self._transport.is_closing():
            self._transport.resume_reading()

    def cancel_hold(self) -> None:
        if self._held is not None:
            self._held.cancel()
            self._held = None
