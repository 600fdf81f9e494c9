"""The session's lifecycle phase, every legal move in one table (in the manner of h11's ``_state.py``).

``OPEN``: client input is admitted. ``STOPPING``: ``session.stop`` or a fatal error arrived; nothing new is
admitted (typed requests still get their answer) while the work already queued winds down. ``CLOSED``: the
terminal; every later input is ignored. A disconnect closes from either phase. Whether settings are still
mutable is not a phase: it follows from what ran (a client turn, a typed job, a model position).
"""

from __future__ import annotations

import enum

from ..errors import StateError


class Phase(enum.Enum):
    OPEN = "open"
    STOPPING = "stopping"
    CLOSED = "closed"


class Move(enum.Enum):
    STOP = "stop"
    """``session.stop``, or a fatal error before its outputs are published."""
    CLOSE = "close"
    """The session ended: its closing position ran, a fatal error was published, or the transport went away."""


_TABLE: dict[Phase, dict[Move, Phase]] = {
    Phase.OPEN: {Move.STOP: Phase.STOPPING, Move.CLOSE: Phase.CLOSED},
    Phase.STOPPING: {Move.STOP: Phase.STOPPING, Move.CLOSE: Phase.CLOSED},
    Phase.CLOSED: {},
}


def next_phase(phase: Phase, move: Move) -> Phase:
    """The phase after ``move``; :class:`~vllm_omni_voicechat.errors.StateError` when it is illegal."""
    try:
        return _TABLE[phase][move]
    except KeyError:
        raise StateError(f"{move.value} is illegal in phase {phase.value}") from None
