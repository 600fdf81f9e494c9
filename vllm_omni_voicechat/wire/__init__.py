"""Wire dialects: parsers (client JSON -> commands or typed errors) and projectors (native events -> wire)."""

from .transport import CloseTransport, Outbound, compact_json

__all__ = ["CloseTransport", "Outbound", "compact_json"]
