"""The server-side tap: route one socket's ASGI traffic through a trace checker.

The server calls :func:`tap_socket` once per accepted socket when ``ServerConfig.trace_factory`` is set (tests set
it for every integration test). The tap wraps the socket's ASGI ``send``/``receive`` so every frame is seen in the
order it really crossed the transport, whichever code path sent it; the wrapper itself does no I/O of its own. A
writer that bypasses ASGI (the outbox's batched writes on our uvicorn protocol) reports its frames through
:func:`traced`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol


class Trace(Protocol):
    def client_event(self, message: Any) -> None: ...
    def server_event(self, message: Any) -> None: ...
    def transport_closed(self, code: int | None) -> None: ...


_TAPPED = "voicechat.trace"


def traced(websocket: Any) -> Trace | None:
    """The trace tapping ``websocket``, if any."""
    return websocket.scope.get(_TAPPED)


def tap_socket(websocket: Any, factory: Callable[[str], Trace] | None, dialect: str) -> Trace | None:
    """Install the tap on ``websocket`` (a Starlette WebSocket) for ``dialect``; idempotent; None without a
    factory. ``dialect`` is ``v3``, ``tiered`` or ``tiered-openai``."""
    if factory is None:
        return None
    scope = websocket.scope
    if _TAPPED in scope:
        return scope[_TAPPED]
    trace = factory(dialect)
    scope[_TAPPED] = trace
    # The class's methods on a weak reference: bound methods kept on the socket would make it a cycle, which
    # outlives its connection with the collector off (tests/test_session_freed.py).
    owner = weakref.ref(websocket)
    cls = type(websocket)

    async def send(message: Any) -> None:
        await cls.send(owner(), message)

    async def receive() -> Any:
        return await cls.receive(owner())

    async def tapped_send(message: Any) -> None:
        # Recorded in program order, before the transport may fail: what the server meant to send, in order.
        kind = message.get("type")
        if kind == "websocket.send":
            text = message.get("text")
            trace.server_event(text if text is not None else message.get("bytes"))
        elif kind == "websocket.close":
            trace.transport_closed(message.get("code", 1000))
        await send(message)

    async def tapped_receive() -> Any:
        message = await receive()
        kind = message.get("type")
        if kind == "websocket.receive":
            text = message.get("text")
            trace.client_event(text if text is not None else message.get("bytes"))
        elif kind == "websocket.disconnect":
            trace.transport_closed(None)
        return message

    websocket.send = tapped_send
    websocket.receive = tapped_receive
    return trace
