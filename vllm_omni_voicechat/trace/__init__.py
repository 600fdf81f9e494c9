"""Trace invariants: a pure checker of one socket's client/server event stream (docs/reliability.md)."""

from .checker import TraceChecker, TraceViolation
from .tap import tap_socket

__all__ = ["TraceChecker", "TraceViolation", "tap_socket"]
