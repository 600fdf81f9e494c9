"""Wire dialects: parsers (client JSON -> commands or typed errors) and projectors (native events -> wire)."""

from .transport import CloseTransport

__all__ = ["CloseTransport"]
