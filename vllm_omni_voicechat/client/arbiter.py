"""Pipecat's outbound arbiter for the v3 client, as pure ordering state (no I/O): what may be sent next.

Microphone input (``turn_start``, appends, ``commit``) and typed requests pass through it. While a function epoch
is open nothing of them is sent; from a typed request until its terminal microphone input is held; a microphone
turn already on the wire runs to its ``commit`` first. Held turn audio is bounded; audio outside a turn is kept as a
rolling pre-roll while held.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..audio.frames import INPUT_SAMPLE_RATE
from .contract import Barrier, Event, V3ClientError

if TYPE_CHECKING:
    import asyncio

HELD_INPUT_MAX_BYTES = 1024 * 1024  # held microphone turn audio per hold (epoch / typed job)
HELD_PREROLL_SECONDS = 0.4  # rolling audio kept, while held, from outside any turn


class ArbiterCapacityError(V3ClientError):
    """Client-side and recoverable: held microphone input overflowed its bound, so the held turn was dropped.

    ``dropped`` lists the held operations that were discarded (never sent). A turn whose ``turn_start`` had
    already been sent is closed by its commit (``closing_commit``, sent once the hold ends) with none of the
    held audio.
    """

    code = "arbiter_capacity"
    fatal = False

    def __init__(self, client_turn_id: int | None, limit: int, held_bytes: int) -> None:
        self.client_turn_id = client_turn_id
        self.limit = limit
        self.held_bytes = held_bytes
        self.dropped: list[WireText] = []
        self.closing_commit: WireText | None = None
        self.needs_commit = False
        super().__init__(
            f"arbiter_capacity: held microphone input of client turn {client_turn_id} would exceed {limit} bytes "
            f"({held_bytes} held); the held turn was dropped"
        )


@dataclass(eq=False)
class WireText:
    """One arbitrated client event: ``kind`` is ``turn_start``, ``append``, ``commit`` or ``typed``."""

    kind: str
    event: Event
    client_turn_id: int | None = None  # microphone input: the client turn it belongs to (None: outside a turn)
    job_id: str | None = None
    audio_bytes: int = 0
    barrier: Barrier | None = None
    held: bool = False  # it could not be sent at once
    internal: bool = False  # sent on the client's own behalf (nobody awaits it)
    seq: int = 0
    sent: asyncio.Future[bool] | None = field(default=None, repr=False)  # True: written; False: dropped pre-roll

    @property
    def microphone(self) -> bool:
        return self.kind != "typed"


class OutboundArbiter:
    """Pipecat's outbound arbiter, as pure ordering state (no I/O): what may be sent next.

    * While a function epoch is open nothing is released.
    * A microphone turn whose ``turn_start`` was released runs to its ``commit`` (its appends and commit
      first; typed requests wait, the server would reject them with ``input_turn_active``).
    * Otherwise pending typed requests go first (in order), then microphone input, which is held while a typed
      job is in flight (from its request until ``rejected`` / ``injection_finished``). A typed request does not
      wait for an earlier typed job: the server replaces it (not yet injecting) or queues behind it.
    * Held turn audio is bounded by ``max_held_bytes``; an overflow drops the held turn. Held audio from
      outside any turn is a rolling pre-roll of ``preroll_bytes``.
    """

    def __init__(self, *, max_held_bytes: int = HELD_INPUT_MAX_BYTES, preroll_bytes: int | None = None) -> None:
        if preroll_bytes is None:
            preroll_bytes = round(INPUT_SAMPLE_RATE * 2 * HELD_PREROLL_SECONDS)
        if max_held_bytes <= 0 or preroll_bytes <= 0:
            raise ValueError("held input bounds must be positive")
        self.max_held_bytes = max_held_bytes
        self.preroll_bytes = preroll_bytes
        self.epoch: str | None = None  # the open function call
        self.typed_in_flight: list[str] = []  # job ids released and not yet terminal
        self.wire_turn: int | None = None  # client turn whose turn_start was released but not its commit
        self.dropped_turns: dict[int, ArbiterCapacityError] = {}
        self.trimmed_preroll_bytes = 0
        self._mic: list[WireText] = []
        self._typed: list[WireText] = []
        self._seq = 0

    # --- state changes

    def open_epoch(self, call_id: str) -> None:
        self.epoch = call_id

    def close_epoch(self, call_id: str | None = None) -> None:
        if call_id is None or call_id == self.epoch:
            self.epoch = None

    def typed_finished(self, job_id: str) -> None:
        if job_id in self.typed_in_flight:
            self.typed_in_flight.remove(job_id)

    # --- queries

    def pending(self) -> list[WireText]:
        """Every queued (not yet released) operation, in the order it was offered."""
        return sorted(self._mic + self._typed, key=lambda op: op.seq)

    @property
    def held_bytes(self) -> int:
        return sum(op.audio_bytes for op in self._mic)

    def hold_reason(self) -> str | None:
        """Why microphone input offered now would be held (None: it would go out at once)."""
        if self.epoch is not None:
            return f"function epoch {self.epoch}"
        if self.wire_turn is not None:
            return None
        if self._typed:
            return "typed request pending"
        if self.typed_in_flight:
            return f"typed job {self.typed_in_flight[0]} in flight"
        return None

    # --- offering and releasing

    def offer(self, op: WireText) -> list[WireText]:
        """Queue ``op``; returns queued pre-roll appends trimmed to make room (they will never be sent).

        Raises :class:`ArbiterCapacityError` (with the dropped operations; ``op`` itself is not queued) when
        held turn audio would exceed ``max_held_bytes``.
        """
        self._seq += 1
        op.seq = self._seq
        blocked = self.hold_reason() is not None
        op.held = self.epoch is not None or (blocked if op.microphone else self.wire_turn is not None)
        if not op.microphone:
            self._typed.append(op)
            return []
        if op.kind == "append" and blocked:
            if op.client_turn_id is None:
                self._mic.append(op)
                return self._trim_preroll()
            held = self.held_bytes
            if held + op.audio_bytes > self.max_held_bytes:
                raise self._drop_turn(op.client_turn_id, held)
        self._mic.append(op)
        return []

    def pop_ready(self) -> WireText | None:
        """The next operation to send now, if any (it leaves the queue and updates the wire state)."""
        op: WireText | None = None
        if self.epoch is None:
            if self.wire_turn is not None:
                if self._mic:
                    op = self._mic.pop(0)
            elif self._typed:
                op = self._typed.pop(0)
            elif self._mic and not self.typed_in_flight:
                op = self._mic.pop(0)
        if op is None:
            for waiting in self._mic + self._typed:
                waiting.held = True
            return None
        if op.kind == "typed":
            self.typed_in_flight.append(op.job_id)
        elif op.kind == "turn_start":
            self.wire_turn = op.client_turn_id
        elif op.kind == "commit":
            self.wire_turn = None
        return op

    def clear(self) -> list[WireText]:
        """Remove and return everything queued (the session ended)."""
        ops = self.pending()
        self._mic.clear()
        self._typed.clear()
        return ops

    # --- internals

    def _trim_preroll(self) -> list[WireText]:
        tail = 0
        while tail < len(self._mic):
            op = self._mic[-1 - tail]
            if op.kind != "append" or op.client_turn_id is not None:
                break
            tail += 1
        segment = self._mic[len(self._mic) - tail :]
        trimmed: list[WireText] = []
        total = sum(op.audio_bytes for op in segment)
        while total > self.preroll_bytes and len(segment) > 1:
            oldest = segment.pop(0)
            self._mic.remove(oldest)
            total -= oldest.audio_bytes
            trimmed.append(oldest)
        self.trimmed_preroll_bytes += sum(op.audio_bytes for op in trimmed)
        return trimmed

    def _drop_turn(self, client_turn_id: int, held: int) -> ArbiterCapacityError:
        error = ArbiterCapacityError(client_turn_id, self.max_held_bytes, held)
        on_wire = self.wire_turn == client_turn_id
        kept: list[WireText] = []
        for op in self._mic:
            if op.client_turn_id != client_turn_id:
                kept.append(op)
            elif on_wire and op.kind == "commit":
                error.closing_commit = op  # still sent: it closes the turn the server already opened
                kept.append(op)
            else:
                error.dropped.append(op)
        self._mic = kept
        error.needs_commit = on_wire and error.closing_commit is None
        self.dropped_turns[client_turn_id] = error
        return error
