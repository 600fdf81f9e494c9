"""Wire dialects: parsers (client JSON -> commands or typed errors) and projectors (native events -> wire)."""

from .transport import CloseTransport, WireText, compact_json

__all__ = ["CloseTransport", "WireText", "compact_json"]
