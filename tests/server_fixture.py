"""A real uvicorn server on a free loopback port, in a background thread, for integration tests."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from dataclasses import replace

from websockets.sync.client import ClientConnection, connect

from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.server.app import VoicechatServer
from vllm_omni_voicechat.server.inprocess import InProcessServer
from vllm_omni_voicechat.trace.recorder import TraceRecorder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(config: ServerConfig) -> Iterator[str]:
    """Yields the base ws:// URL once uvicorn is listening; stops and joins the server afterwards."""
    with running_app(config) as (url, _):
        yield url


@contextlib.contextmanager
def running_app(config: ServerConfig, *, check_traces: bool = True) -> Iterator[tuple[str, VoicechatServer]]:
    """Like ``running_server`` but also yields the app's VoicechatServer (admission, live sessions).

    Every socket the server serves goes through a TraceChecker (``ServerConfig.trace_factory``); at exit, once
    the server has stopped, any invariant violation fails the test with the listing."""
    recorder = TraceRecorder(config.trace_factory, history=int(os.environ.get("VOICECHAT_TRACE_HISTORY", "40")))
    if check_traces:
        config = replace(config, trace_factory=recorder)
    with InProcessServer(config) as server:
        server.app.state.traces = recorder
        yield server.url, server.voicechat
    recorder.check()


class RawClient:
    """A raw JSON WebSocket client: no protocol help, explicit timeouts on every receive."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.ws: ClientConnection = connect(
            url, open_timeout=timeout, ping_interval=None, max_size=None, proxy=None, legacy=True
        )
        self.timeout = timeout
        self.received: list[dict] = []
        self.close_reason: str | None = None
        """The reason of the server's close frame, once :meth:`close_code` saw it."""

    def send(self, event: dict | str | bytes) -> None:
        self.ws.send(event if isinstance(event, (str, bytes)) else json.dumps(event))

    def recv(self) -> dict:
        event = json.loads(self.ws.recv(timeout=self.timeout))
        self.received.append(event)
        return event

    def recv_until(self, predicate, *, skip_metrics: bool = True) -> list[dict]:
        """Receive until ``predicate(event)``; returns the events (metrics dropped unless asked for)."""
        out = []
        while True:
            e = self.recv()
            if not (skip_metrics and e["type"] == "voicechat.metrics"):
                out.append(e)
            if predicate(e):
                return out

    def recv_type(self, type_: str) -> dict:
        return self.recv_until(lambda e: e["type"] == type_)[-1]

    def close_code(self) -> int | None:
        """Drain until the server closes; returns the close code."""
        from websockets.exceptions import ConnectionClosed

        try:
            while True:
                self.recv()
        except ConnectionClosed as closed:
            self.close_reason = closed.rcvd.reason if closed.rcvd else None
            return closed.rcvd.code if closed.rcvd else None

    def expected_close_reason(self) -> str:
        """What the close frame must carry after what was received: the first fatal error's code, else the
        ``session.closed`` reason (contract close reasons; at most 123 UTF-8 bytes)."""
        for e in self.received:
            if e["type"] == "error" and e["error"]["fatal"]:
                return e["error"]["code"]
        closed = [e for e in self.received if e["type"] == "session.closed"]
        return closed[-1]["reason"] if closed else ""

    def close(self) -> None:
        self.ws.close()
