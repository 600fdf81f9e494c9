"""The project's exceptions have one root, :class:`VoicechatError`: a caller catches everything this package raises
with it, and a test can tell ours from a library's. Each also keeps the builtin it always was (``ValueError``,
``RuntimeError``...), so existing ``except`` clauses hold.

:class:`StateError` is the one for a state machine driven out of order: raised when a caller (a shell, a host, a
test) makes a move the current state does not allow, in the manner of h11's ``LocalProtocolError``: a bug in the
caller, never something a client's bytes can cause (client mistakes are typed error events).
"""

from __future__ import annotations


class VoicechatError(Exception):
    """The root of every exception this package defines."""


class StateError(VoicechatError, RuntimeError):
    """An input that is illegal in the current state of a sans-I/O object."""
