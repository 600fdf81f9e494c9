"""Clients for the voicechat wire protocols."""

from .v3 import (
    APPEND_BYTES,
    OUTPUT_SAMPLE_RATE,
    PROTOCOL,
    ProtocolError,
    Response,
    ServerError,
    SessionEnded,
    TypedJob,
    UserTurn,
    V3Client,
    V3ClientError,
)

__all__ = [
    "APPEND_BYTES",
    "OUTPUT_SAMPLE_RATE",
    "PROTOCOL",
    "ProtocolError",
    "Response",
    "ServerError",
    "SessionEnded",
    "TypedJob",
    "UserTurn",
    "V3Client",
    "V3ClientError",
]
