"""Our uvicorn: a server that ends our sessions first when it shuts down, and a WebSocket protocol that lets the
app drop a connection.

ASGI has no abort, and a graceful close waits on a reader that may never read. uvicorn takes a protocol class for
its ``ws`` setting; ours is its default one, recording each connection's asyncio transport (given to
``connection_made``, the standard asyncio protocol callback) under the connection's addresses, which the ASGI
scope carries as ``client`` and ``server``. Under another ASGI server (vLLM-Omni's own uvicorn) no transport is
known and a stalled socket is closed, not reset.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol

_Key = tuple[str, int, str, int]
_TRANSPORTS: dict[_Key, asyncio.BaseTransport] = {}


def _key(client: Any, server: Any) -> _Key | None:
    if not (isinstance(client, (tuple, list)) and isinstance(server, (tuple, list))):
        return None
    if len(client) < 2 or len(server) < 2:
        return None
    return (str(client[0]), int(client[1]), str(server[0]), int(server[1]))


class AbortableWebSockets(AutoWebSocketsProtocol):  # type: ignore[misc,valid-type]
    """uvicorn's default WebSocket protocol, with its transport findable from the ASGI scope."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        self.voicechat_key = _key(transport.get_extra_info("peername"), transport.get_extra_info("sockname"))
        if self.voicechat_key is not None:
            _TRANSPORTS[self.voicechat_key] = transport
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.voicechat_key is not None:
            _TRANSPORTS.pop(self.voicechat_key, None)
        super().connection_lost(exc)


def transport_for(websocket: Any) -> Any:
    """The asyncio transport of a Starlette WebSocket served by :class:`AbortableWebSockets`, else None."""
    scope = websocket.scope
    key = _key(scope.get("client"), scope.get("server"))
    return _TRANSPORTS.get(key) if key is not None else None


def uvicorn_config(app: Any, **kwargs: Any) -> uvicorn.Config:
    """uvicorn's config for our app: protocol-level pings off (long model steps or slow consumers must never trip a
    transport timer), permessage-deflate off unless asked for (base64 audio barely compresses, and compressing
    every event cost ~12 % of the server's CPU; a client that offers it still connects, uncompressed), our
    WebSocket protocol."""
    kwargs.setdefault("ws_ping_interval", None)
    kwargs.setdefault("ws_ping_timeout", None)
    kwargs.setdefault("ws_per_message_deflate", False)
    kwargs.setdefault("ws", AbortableWebSockets)
    return uvicorn.Config(app, **kwargs)


class VoicechatUvicornServer(uvicorn.Server):
    """uvicorn's server, ending our sessions first when it shuts down (``VoicechatServer.end_all_sessions``)."""

    def __init__(self, config: uvicorn.Config, voicechat: Any) -> None:
        if config.ws == "auto":
            config.ws = AbortableWebSockets
        super().__init__(config)
        self.voicechat = voicechat

    async def shutdown(self, sockets: Any = None) -> None:
        self.voicechat.end_all_sessions()
        await super().shutdown(sockets=sockets)
