"""A real uvicorn server on a free loopback port, in a background thread, for integration tests."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import socket
import struct
from collections.abc import Iterable, Iterator
from dataclasses import replace
from urllib.parse import urlsplit

from websockets.sync.client import ClientConnection, connect

from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.server.app import VoicechatServer
from vllm_omni_voicechat.server.inprocess import InProcessServer
from vllm_omni_voicechat.trace.recorder import TraceRecorder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_block(offsets: Iterable[int], attempts: int = 200) -> int:
    """A base port ``p`` such that ``p + o`` is free for every offset, below the kernel's ephemeral range: a port
    picked inside it (``free_port() + 1``) can become a client connection's local port before the server binds it,
    and the server then fails with 'address already in use'."""
    offsets = list(offsets)
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    high = min(ephemeral_low, 65536) - max(offsets) - 1
    low = min(10000, high - 1000)
    chooser = random.Random()
    for _ in range(attempts):
        base = chooser.randrange(low, high)
        if all(_bindable(base + o) for o in offsets):
            return base
    raise RuntimeError(f"no free block of ports for offsets {offsets} below {ephemeral_low}")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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


class SocketClient:
    """A WebSocket client on a bare socket: reads only when asked, sends any frame (or only a frame's header).

    For what a library client will not do: never read its socket (a stalled reader) or announce a payload it
    never sends."""

    def __init__(self, url: str, *, rcvbuf: int | None = None, timeout: float = 10.0) -> None:
        parts = urlsplit(url)
        self.sock = socket.socket()
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((parts.hostname, parts.port))
        key = base64.b64encode(os.urandom(16)).decode()
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += self._exact(1)
        assert head.startswith(b"HTTP/1.1 101"), head

    def _exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    @staticmethod
    def _header(length: int) -> bytes:
        """A masked text frame's header (the mask key not included)."""
        if length < 126:
            return struct.pack("!BB", 0x81, 0x80 | length)
        if length < 1 << 16:
            return struct.pack("!BBH", 0x81, 0x80 | 126, length)
        return struct.pack("!BBQ", 0x81, 0x80 | 127, length)

    def send(self, event: dict | str) -> None:
        data = (event if isinstance(event, str) else json.dumps(event)).encode()
        n = len(data)
        mask = os.urandom(4)
        key = int.from_bytes((mask * (n // 4 + 1))[:n] or b"\0", "big")
        masked = (int.from_bytes(data or b"\0", "big") ^ key).to_bytes(max(n, 1), "big")[:n]
        self.sock.sendall(self._header(n) + mask + masked)

    def send_header(self, length: int) -> None:
        """A text frame's header announcing ``length`` bytes, and no payload."""
        self.sock.sendall(self._header(length) + os.urandom(4))

    def recv_frame(self) -> tuple[int, bytes]:
        """The next frame: its opcode and payload."""
        b0, b1 = self._exact(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._exact(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._exact(8))[0]
        return b0 & 0x0F, self._exact(n)

    def recv(self) -> dict:
        """The next event; a close frame reads as ``{"type": "<close>", "code": ...}``."""
        opcode, payload = self.recv_frame()
        if opcode == 8:
            return {"type": "<close>", "code": struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None}
        return json.loads(payload)

    def recv_type(self, type_: str) -> dict:
        while (e := self.recv())["type"] != type_:
            pass
        return e

    def close_code(self) -> int | None:
        """Receive until the close frame; its code."""
        return self.recv_type("<close>")["code"]

    def close(self) -> None:
        self.sock.close()
