"""The standalone ASGI server: routes, admission, one runtime per session."""

from .app import create_app
from .config import ServerConfig

__all__ = ["ServerConfig", "create_app"]
