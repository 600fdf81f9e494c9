"""What a wire protocol object tells its transport beyond events."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CloseTransport:
    """Close the connection with this WebSocket close code, after everything before it was sent."""

    code: int
    reason: str = ""
