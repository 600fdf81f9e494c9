"""Session admission: a fixed number of concurrent sessions, and (off by default) a bounded FIFO of connections
waiting for one. Synchronous bookkeeping on the server's loop; the waiting connection learns of its new position
or its slot through the ``on_change`` callback it enqueued with (the server sets an asyncio event there)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable


class Slot:
    """One admitted session's place; ``release`` is idempotent, so the session's end frees it once, early (before
    its socket's close handshake), and the connection handler's ``finally`` is only a backstop."""

    __slots__ = ("_admission", "released")

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._admission._release()


class Ticket:
    """A connection waiting in the queue: its 1-based ``position``, then its ``slot`` once admitted; position -1
    when the queue was closed under it (the replica drains): it gets the busy answer."""

    __slots__ = ("position", "slot", "_on_change")

    def __init__(self, position: int, on_change: Callable[[], None]) -> None:
        self.position = position
        self.slot: Slot | None = None
        self._on_change = on_change


class Admission:
    def __init__(self, capacity: int, on_release: Callable[[], None] | None = None, *, queue_capacity: int = 0) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        if queue_capacity < 0:
            raise ValueError("queue_capacity must be >= 0")
        self.capacity = capacity
        self.queue_capacity = queue_capacity
        self.active = 0
        self.draining = False
        """Set by ``drain``: no new session is admitted (the replica is being taken out of its balancer's farm);
        the sessions it holds go on, and resume, until they end."""
        self.waiting: deque[Ticket] = deque()
        self.on_release = on_release  # observers (tests, metrics) learn when a slot frees

    @property
    def free(self) -> int:
        """Slots a new session could take now (none while draining)."""
        return 0 if self.draining else max(0, self.capacity - self.active - len(self.waiting))

    def drain(self) -> None:
        """Admit no new session from now on; the connections waiting in the queue get the busy answer."""
        self.draining = True
        while self.waiting:
            ticket = self.waiting.popleft()
            ticket.position = -1  # refused: see Ticket
            ticket._on_change()

    def try_acquire(self) -> Slot | None:
        """A slot now, or None (every slot taken, others are already queued for one (first come, first served), or
        the replica drains)."""
        if self.draining or self.active >= self.capacity or self.waiting:
            return None
        self.active += 1
        return Slot(self)

    def enqueue(self, on_change: Callable[[], None]) -> Ticket | None:
        """Wait for a slot at the back of the queue; None when the queue is full (or off). With a slot free and
        nobody waiting the ticket is admitted at once (position 0, its ``slot`` set)."""
        slot = self.try_acquire()
        if slot is not None:
            ticket = Ticket(0, on_change)
            ticket.slot = slot
            return ticket
        if self.draining or len(self.waiting) >= self.queue_capacity:
            return None
        ticket = Ticket(len(self.waiting) + 1, on_change)
        self.waiting.append(ticket)
        return ticket

    def leave(self, ticket: Ticket) -> None:
        """A queued connection gave up (disconnect, timeout): the ones behind it move up."""
        try:
            self.waiting.remove(ticket)
        except ValueError:
            return  # admitted meanwhile, or already gone
        self._renumber()

    def _renumber(self) -> None:
        for position, ticket in enumerate(self.waiting, start=1):
            if ticket.position != position:
                ticket.position = position
                ticket._on_change()

    def _release(self) -> None:
        if self.active <= 0:
            raise RuntimeError("release without acquire")
        self.active -= 1
        if self.waiting:  # the freed slot goes to the head of the queue at once
            head = self.waiting.popleft()
            self.active += 1
            head.slot = Slot(self)
            head.position = 0
            head._on_change()
            self._renumber()
        if self.on_release is not None:
            self.on_release()
