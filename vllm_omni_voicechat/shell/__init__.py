"""I/O shells around the sans-I/O session core: a synchronous one on a virtual clock (tests, examples,
benchmarks) and an asyncio one that runs the model off the event loop (servers)."""

from .clock import VirtualClock
from .sync import SyncDriver

__all__ = ["SyncDriver", "VirtualClock"]
