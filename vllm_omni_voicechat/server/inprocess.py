"""The server on a free loopback port in a background thread: tests, benchmarks and examples that need a real
server in their own process."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

from .app import create_app
from .config import ServerConfig
from .heap import Heap
from .uvicorn import VoicechatUvicornServer, uvicorn_config


class InProcessServer:
    """Starts at once (bound and listening before uvicorn runs: connections queue in the backlog instead of being
    refused); ``url`` is the ``ws://`` base, ``app`` the Starlette app, ``voicechat`` its ``VoicechatServer``,
    ``loop`` the server's event loop. A context manager; :meth:`stop` stops and joins it."""

    def __init__(self, config: ServerConfig, *, start_timeout_s: float = 30.0, manage_heap: bool = False,
                 heap: Heap | None = None, **uvicorn_kwargs: Any) -> None:
        ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None

        def on_ready() -> None:
            self.loop = asyncio.get_running_loop()
            ready.set()

        self.app = create_app(config, on_ready=on_ready, manage_heap=manage_heap, heap=heap)
        self.voicechat = self.app.state.voicechat
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.url = f"ws://127.0.0.1:{self.port}"
        uvicorn_kwargs.setdefault("log_level", "warning")
        self.server = VoicechatUvicornServer(uvicorn_config(self.app, **uvicorn_kwargs), self.voicechat)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        if not ready.wait(start_timeout_s):
            self.stop()
            raise RuntimeError("server did not start")

    def stop(self, timeout_s: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        self.sock.close()

    def __enter__(self) -> InProcessServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
