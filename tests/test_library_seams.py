"""The private parts of uvicorn and websockets that server/uvicorn.py and server/reader.py touch, checked on the
installed versions: a version whose internals differ fails here, by name, before any socket test does. The
pyproject bounds are the versions these were read from and tested against."""

from __future__ import annotations

import asyncio
import gc
import inspect
import tomllib
import weakref
from importlib import metadata
from pathlib import Path

import pytest
import uvicorn
import websockets
from packaging.requirements import Requirement
from packaging.version import Version
from uvicorn.config import Config
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState
from websockets.frames import apply_mask
from websockets.protocol import Protocol, State
from websockets.server import ServerProtocol
from websockets.streams import StreamReader

from vllm_omni_voicechat.server.uvicorn import AbortableWebSockets, release_parser

ROOT = Path(__file__).resolve().parents[1]


def declared(name: str) -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(r for r in map(Requirement, deps) if r.name == name)


@pytest.mark.parametrize("name", ["uvicorn", "websockets"])
def test_the_installed_version_is_within_the_declared_bounds_and_the_bounds_have_a_ceiling(name):
    requirement = declared(name)
    assert Version(metadata.version(name)) in requirement.specifier
    assert any(s.operator == "<" for s in requirement.specifier), f"{name}: private parts are used, pin a ceiling"


def test_uvicorn_sans_io_protocol_keeps_the_attributes_we_read_and_write():
    """AbortableWebSockets subclasses it and uses: ``queue`` (the ASGI receive queue, whose length paces reading),
    ``read_paused`` (its flow-control flag), ``frames`` / ``curr_msg_data_type`` (its message assembly, which our
    fast path completes), ``disconnected`` / ``close_sent`` / ``handshake_complete`` / ``handshake_initiated``
    (when a write may go out), ``conn`` (websockets' ServerProtocol) and ``transport``. ``frames`` came in 0.50,
    ``disconnected`` in 0.53: the floor."""

    async def build() -> WebSocketsSansIOProtocol:
        config = Config(app=lambda scope, receive, send: None, ws="websockets-sansio", lifespan="off")
        return AbortableWebSockets(config=config, server_state=ServerState(), app_state={},
                                   _loop=asyncio.get_running_loop())

    protocol = asyncio.run(build())
    assert isinstance(protocol.queue, asyncio.Queue)
    assert protocol.read_paused is False
    assert protocol.frames == [] and protocol.curr_msg_data_type in ("text", "bytes")
    assert (protocol.disconnected, protocol.close_sent, protocol.handshake_complete) == (False, False, False)
    assert protocol.handshake_initiated is False
    assert isinstance(protocol.conn, ServerProtocol) and isinstance(protocol.conn, Protocol)
    for method in ("connection_made", "data_received", "connection_lost", "handle_events", "send_receive_event_to_app",
                   "handle_text", "handle_bytes", "handle_cont"):
        assert callable(getattr(WebSocketsSansIOProtocol, method, None)), method
    assert "ws" in inspect.signature(Config).parameters


def test_websockets_sans_io_keeps_the_parts_we_use():
    """The fast path reads ``conn.reader.buffer`` (bytes websockets has not parsed yet), the frame size limits, the
    connection ``state``, and unmasks with ``websockets.frames.apply_mask``."""
    conn = ServerProtocol(max_size=1 << 20)
    assert isinstance(conn.reader, StreamReader) and isinstance(conn.reader.buffer, bytearray)
    assert conn.max_message_size == 1 << 20 and hasattr(conn, "max_fragment_size")
    assert conn.state is State.CONNECTING
    assert apply_mask(b"\x01\x02\x03\x04\x05", b"\x01\x01\x01\x01") == b"\x00\x03\x02\x05\x04"
    assert websockets.version.version and uvicorn.__version__


@pytest.mark.parametrize("ending", ["open", "bad request", "bad frame"])
def test_websockets_parser_and_its_errors_are_what_keeps_a_protocol_alive(ending):
    """``connection_lost`` lets go of ``conn.parser`` (a generator whose frame holds the protocol) and of the
    tracebacks of ``conn.parser_exc`` / ``conn.handshake_exc`` (through that frame): without it every connection's
    websockets protocol is a cycle left to the collector."""

    def connection() -> ServerProtocol:
        conn = ServerProtocol(max_size=1 << 20)
        if ending == "bad request":
            conn.receive_eof()
            assert conn.handshake_exc is not None and conn.handshake_exc.__cause__ is not None
        elif ending == "bad frame":
            conn.state = State.OPEN
            conn.parser = conn.parse()
            next(conn.parser)
            conn.receive_data(bytes((0x81, 0x02)) + b"hi")  # unmasked: a protocol error on a server
            assert conn.parser_exc is not None
        assert inspect.isgenerator(conn.parser)
        return conn

    gc.collect()
    gc.disable()
    try:
        left = weakref.ref(connection())
        assert left() is not None  # the cycle
        released = connection()
        release_parser(released)
        gone = weakref.ref(released)
        del released
        assert gone() is None
    finally:
        gc.enable()
        gc.collect()


def test_websockets_reads_the_message_limit_per_frame():
    """``limit_messages`` lowers ``max_message_size`` after the handshake: websockets' parser reads it for each frame,
    so the next frame over it is refused (close 1009) from its header alone."""
    from websockets.protocol import Side

    conn = Protocol(Side.SERVER, state=State.OPEN, max_size=1 << 20)
    conn.max_message_size = 10
    conn.receive_data(bytes((0x81, 0x80 | 20)) + b"\0\0\0\0")  # a masked text header announcing 20 bytes, no payload
    sent = b"".join(conn.data_to_send())
    assert sent[:1] == b"\x88" and sent[2:4] == (1009).to_bytes(2, "big")


def test_uvicorn_h11_protocol_keeps_the_attributes_the_head_deadline_reads():
    """HeadTimedH11 subclasses uvicorn's h11 protocol and reads ``loop``, ``cycle`` (None until a request head has
    been parsed) and ``transport``, and overrides ``connection_made`` / ``data_received`` / ``connection_lost``."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from vllm_omni_voicechat.server.uvicorn import HeadTimedH11

    async def build() -> H11Protocol:
        config = Config(app=lambda scope, receive, send: None, http="h11", lifespan="off")
        config.load()
        return HeadTimedH11(config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop())

    protocol = asyncio.run(build())
    assert protocol.cycle is None and protocol.transport is None
    assert isinstance(protocol.loop, asyncio.AbstractEventLoop)
    for method in ("connection_made", "data_received", "connection_lost"):
        assert callable(getattr(H11Protocol, method, None)), method


def test_uvicorn_server_keeps_the_hooks_a_draining_replica_overrides():
    """VoicechatUvicornServer overrides ``handle_exit(sig, frame)`` (a replica's first SIGTERM drains) and
    ``on_tick(counter)`` (the loop-side check that the drain is over), and sets ``should_exit``."""
    import inspect

    from vllm_omni_voicechat.server.uvicorn import VoicechatUvicornServer

    assert list(inspect.signature(uvicorn.Server.handle_exit).parameters) == ["self", "sig", "frame"]
    assert list(inspect.signature(uvicorn.Server.on_tick).parameters) == ["self", "counter"]
    assert inspect.iscoroutinefunction(uvicorn.Server.on_tick)
    assert "self.on_tick(" in inspect.getsource(uvicorn.Server.main_loop)  # its loop still asks on_tick
    assert VoicechatUvicornServer.on_tick is not uvicorn.Server.on_tick
