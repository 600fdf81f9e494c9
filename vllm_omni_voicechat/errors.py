"""The project's one exception for a state machine driven out of order.

Raised when a caller (a shell, a host, a test) makes a move the current state does not allow, in the manner of
h11's ``LocalProtocolError``: a bug in the caller, never something a client's bytes can cause (client mistakes
are typed error events).
"""

from __future__ import annotations


class StateError(RuntimeError):
    """An input that is illegal in the current state of a sans-I/O object."""
