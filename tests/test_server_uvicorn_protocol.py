"""Our uvicorn WebSocket protocol (server/uvicorn.py) driven byte by byte: a websockets client protocol (sans-I/O)
on the other side of a recording transport, no sockets. Several texts go out in one transport write; reading
pauses only when the app is ``READ_AHEAD_MESSAGES`` behind, and resumes when it has caught up. Then the outbox's
batched writes through the real server."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json

import pytest
import uvicorn
from uvicorn.server import ServerState
from websockets.client import ClientProtocol
from websockets.frames import Opcode
from websockets.http11 import Response
from websockets.sync.client import connect
from websockets.uri import parse_uri

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.server.inprocess import InProcessServer
from vllm_omni_voicechat.server.uvicorn import READ_AHEAD_MESSAGES, AbortableWebSockets

from .server_fixture import running_app
from .test_v3_server import append, barrier, configured


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.calls: list[str] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)


async def _connected() -> tuple[AbortableWebSockets, RecordingTransport, ClientProtocol]:
    accepted = asyncio.Event()

    async def accepting_app(scope, receive, send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        accepted.set()
        await asyncio.Event().wait()  # never reads: the test plays the app's receive itself

    config = uvicorn.Config(accepting_app, ws=AbortableWebSockets, log_level="warning")
    config.load()
    protocol = AbortableWebSockets(config, ServerState(), {}, _loop=asyncio.get_running_loop())
    transport = RecordingTransport()
    protocol.connection_made(transport)
    client = ClientProtocol(parse_uri("ws://127.0.0.1:8000/v1/realtime"))
    client.send_request(client.connect())
    protocol.data_received(b"".join(client.data_to_send()))
    await asyncio.wait_for(accepted.wait(), 10)  # the app's task took the connect message and accepted
    client.receive_data(transport.writes.pop())
    assert isinstance(client.events_received()[0], Response)
    return protocol, transport, client


async def _loop_turns(n: int) -> None:
    """Let the loop run ``n`` times: what these tests check happens on a later loop turn (a flush scheduled with
    call_soon, a task handing held frames on), never after a time."""
    for _ in range(n):
        await asyncio.sleep(0)  # ok: a loop turn, not a delay


def _frames(client: ClientProtocol, data: bytes) -> list[str]:
    client.receive_data(data)
    return [f.data.decode() for f in client.events_received() if f.opcode == Opcode.TEXT]


def test_several_texts_go_out_in_one_transport_write():
    async def scenario() -> None:
        protocol, transport, client = await _connected()
        protocol.write_texts(['{"type":"a"}', '{"type":"b"}', '{"type":"c"}'])
        assert len(transport.writes) == 1
        assert _frames(client, transport.writes[0]) == ['{"type":"a"}', '{"type":"b"}', '{"type":"c"}']
        protocol.close_sent = True
        with pytest.raises(ConnectionError):
            protocol.write_texts(['{"type":"d"}'])
        assert len(transport.writes) == 1
        protocol.connection_lost(None)

    asyncio.run(scenario())


@pytest.mark.parametrize("sizes", [[0, 1, 125], [126, 127, 65_535], [65_536, 70_000], [125, 126, 65_535, 65_536]])
def test_every_length_class_is_framed_as_websockets_frames_it(sizes):
    """The framing of our one write (the 7-bit, 16-bit and 64-bit lengths of RFC 6455 §5.2) is byte for byte what
    websockets' own send_text writes, and the client reads back every text; UTF-8 counts in bytes."""
    async def scenario() -> None:
        protocol, transport, client = await _connected()
        texts = ["é" * (n // 2) + "x" * (n % 2) for n in sizes]
        protocol.write_texts(texts)
        ours = transport.writes.pop()
        conn = protocol.conn
        for text in texts:
            conn.send_text(text.encode())
        assert ours == b"".join(conn.data_to_send())
        assert _frames(client, ours) == texts
        protocol.connection_lost(None)

    asyncio.run(scenario())


def test_what_websockets_queued_goes_first_and_extensions_take_its_own_path():
    """A pong websockets queued for a ping leaves before the texts, in the same write; with an extension
    negotiated every frame goes through websockets."""
    async def scenario() -> None:
        protocol, transport, client = await _connected()
        client.send_ping(b"p")
        protocol.conn.receive_data(b"".join(client.data_to_send()))  # websockets queues the pong; nothing sent yet
        protocol.conn.events_received()
        protocol.write_texts(['{"type":"a"}'])
        client.receive_data(transport.writes.pop())
        assert [(f.opcode, bytes(f.data)) for f in client.events_received()] == [
            (Opcode.PONG, b"p"), (Opcode.TEXT, b'{"type":"a"}')]

        class Tagging:  # an extension that marks every frame it encodes
            name = "x-tag"

            def encode(self, frame):
                return dataclasses.replace(frame, data=b"tagged:" + bytes(frame.data))

        protocol.conn.extensions = [Tagging()]
        protocol.write_texts(['{"type":"b"}'])
        assert transport.writes.pop().endswith(b'tagged:{"type":"b"}')
        protocol.conn.extensions = []
        protocol.connection_lost(None)

    asyncio.run(scenario())


def test_a_closing_peer_turns_into_a_connection_error():
    async def scenario() -> None:
        protocol, transport, client = await _connected()
        client.send_close(1000)
        protocol.data_received(b"".join(client.data_to_send()))
        writes = len(transport.writes)  # the close reply
        with pytest.raises(ConnectionError):
            protocol.write_texts(['{"type":"late"}'])
        assert len(transport.writes) == writes
        protocol.connection_lost(None)

    asyncio.run(scenario())


def test_reading_pauses_only_when_the_app_is_behind_and_resumes_when_it_caught_up():
    async def scenario() -> None:
        protocol, transport, client = await _connected()
        for i in range(READ_AHEAD_MESSAGES - 1):  # one message per read, the app not reading: no pause yet
            client.send_text(f'{{"n":{i}}}'.encode())
            protocol.data_received(b"".join(client.data_to_send()))
        assert transport.calls == []
        assert protocol.queue.qsize() == READ_AHEAD_MESSAGES - 1
        for i in range(READ_AHEAD_MESSAGES - 1, 40):  # the rest in one read: parsed, queued, then paused once
            client.send_text(f'{{"n":{i}}}'.encode())
        protocol.data_received(b"".join(client.data_to_send()))
        assert transport.calls == ["pause"]
        got = [(await protocol.receive())["text"] for _ in range(40)]
        assert got == [f'{{"n":{i}}}' for i in range(40)]
        assert transport.calls == ["pause", "resume"]  # once the queue is empty
        for i in range(5):  # an app that keeps up: reading is never paused
            client.send_text(b'{"n":"again"}')
            protocol.data_received(b"".join(client.data_to_send()))
            assert (await protocol.receive())["text"] == '{"n":"again"}'
        assert transport.calls == ["pause", "resume"]
        protocol.connection_lost(None)

    asyncio.run(scenario())


def test_a_positions_events_leave_in_one_write_and_the_trace_sees_every_frame(monkeypatch):
    """Through the real server: everything an admitted v3 session's client receives went out through
    ``write_texts``, in order and as the trace tap saw it; an audio delta never leaves without its position's
    metrics (both are queued by the same position), so writes are fewer than events."""
    batches: list[list[str]] = []
    write_texts = AbortableWebSockets.write_texts

    def recording(self, texts):
        batches.append(list(texts))
        write_texts(self, texts)

    monkeypatch.setattr(AbortableWebSockets, "write_texts", recording)
    seen: list[str] = []

    class Seen:
        def server_event(self, message):
            seen.append(message)

        def client_event(self, message):
            pass

        def transport_closed(self, code):
            pass

    config = ServerConfig.simulator(settlement_blank_frames=3, max_sessions=2, trace_factory=lambda dialect: Seen())
    with running_app(config) as (url, _):
        c = configured(url)
        c.send(barrier("turn_start", 1, "s1"))
        c.send(append(render_speech("Hi there")))
        c.send(barrier("commit", 1, "c1"))
        c.recv_until(lambda e: e["type"] == "response.done")
        c.send({"type": "session.stop", "event_id": "x"})
        assert c.close_code() == 1000
    written = [text for batch in batches for text in batch]
    assert [json.loads(text) for text in written] == c.received
    assert seen == written
    for batch in batches:
        types = [json.loads(text)["type"] for text in batch]
        if "response.output_audio.delta" in types:
            assert "voicechat.metrics" in types, types
    assert sum("response.output_audio.delta" in text for text in written) >= 10
    assert len(batches) < len(written) / 1.5, (len(batches), len(written))


def test_the_outbox_writes_a_steps_events_at_once_and_waits_out_a_full_transport_buffer():
    """Events queued in one step leave in one write once the step yields (no writer task wakes for them); while
    the transport is above its high-water mark nothing is written, and everything queued meanwhile leaves in
    order, in one write, when it drains."""
    from starlette.websockets import WebSocket

    from vllm_omni_voicechat.server.outbox import BATCH_EVENTS, Outbox

    async def scenario() -> None:
        protocol, transport, client = await _connected()
        scope = {"type": "websocket", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000), "path": "/",
                 "headers": [], "query_string": b""}
        gone: list[bool] = []
        outbox = Outbox(WebSocket(scope, None, None), ServerConfig.simulator(), on_overflow=lambda: None,
                        on_gone=lambda: gone.append(True))
        assert outbox.put('{"type":"a"}') and outbox.put('{"type":"b"}')
        assert transport.writes == []  # not before the step yields
        await _loop_turns(3)
        assert len(transport.writes) == 1
        assert _frames(client, transport.writes.pop()) == ['{"type":"a"}', '{"type":"b"}']

        protocol.pause_writing()  # the transport's buffer is full
        for name in "cde":
            assert outbox.put('{"type":"%s"}' % name)
            await _loop_turns(1)
        await _loop_turns(3)
        assert transport.writes == []
        protocol.resume_writing()
        await _loop_turns(3)
        assert len(transport.writes) == 1
        assert _frames(client, transport.writes.pop()) == ['{"type":"c"}', '{"type":"d"}', '{"type":"e"}']
        assert outbox.sent_events == 5 and outbox.queued_events == 0 and not gone

        burst = ['{"type":"n%d"}' % i for i in range(BATCH_EVENTS + 6)]  # more than one write holds
        for text in burst:
            assert outbox.put(text)
        await _loop_turns(3)
        assert len(transport.writes) == 2
        assert [t for data in transport.writes for t in _frames(client, data)] == burst
        outbox.abort()
        protocol.connection_lost(None)

    asyncio.run(scenario())


def test_frames_go_straight_to_the_session_and_wait_with_reading_paused_when_it_has_no_room():
    """server/reader.py on our protocol: each parsed frame is offered at once; one the session cannot take is held
    with reading paused (TCP backpressure), held frames go on in order when there is room, then reading resumes; a
    frame arriving after the socket was replaced ends the reader."""
    from vllm_omni_voicechat.server.reader import DirectReader

    async def scenario() -> None:
        protocol, transport, client = await _connected()
        room = asyncio.Event()
        taken: list[str] = []

        class Shell:
            full = True

            def offer_nowait(self, message):
                if self.full:
                    return None
                taken.append(message)
                return True

            async def offer(self, message):
                await room.wait()
                self.full = False
                return self.offer_nowait(message)

        class Socket:
            scope: dict = {}

            async def receive(self):
                await asyncio.Event().wait()  # no disconnect in this test

        class Att:
            reads_open = asyncio.Event()
            shell = Shell()
            socket = Socket()

        Att.reads_open.set()

        def send(text: str) -> None:
            client.send_text(text.encode())
            protocol.data_received(b"".join(client.data_to_send()))

        reader = DirectReader(Att, Att.socket, protocol)  # type: ignore[arg-type]
        running = asyncio.ensure_future(reader.run())
        await _loop_turns(1)
        assert protocol.receiver is not None
        for i in range(3):
            send('{"n":%d}' % i)
        assert taken == [] and transport.calls == ["pause"]
        room.set()
        await _loop_turns(5)
        assert taken == ['{"n":0}', '{"n":1}', '{"n":2}'] and transport.calls == ["pause", "resume"]
        send('{"n":3}')
        assert taken[-1] == '{"n":3}' and transport.calls == ["pause", "resume"]  # taken at once, in the parser's call
        Att.socket = object()  # a resume replaced this socket
        send('{"n":4}')
        await asyncio.wait_for(running, 5)
        assert taken[-1] == '{"n":3}' and protocol.receiver is None
        protocol.connection_lost(None)

    asyncio.run(scenario())


def test_with_permessage_deflate_asked_for_a_session_talks_compressed():
    """The opt-in (``--ws-compression``): a client that offers permessage-deflate gets it, and every event of a
    spoken turn reaches it through websockets' own (compressing) framing."""
    with InProcessServer(ServerConfig.simulator(), ws_per_message_deflate=True) as server:
        with connect(server.url + "/v1/realtime", compression="deflate", open_timeout=10, proxy=None) as ws:
            assert [e.name for e in ws.protocol.extensions] == ["permessage-deflate"]
            assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
            ws.send(json.dumps({"type": "session.update", "event_id": "u1",
                                "session": {"protocol_version": 3, "instructions": "Be brief."}}))
            assert json.loads(ws.recv(timeout=10))["type"] == "session.updated"
            pcm = render_speech("hello", 16_000)
            pcm += bytes(-len(pcm) % 2560) + bytes(2560 * 8)
            for i in range(0, len(pcm), 2560):
                ws.send(json.dumps({"type": "input_audio_buffer.append", "event_id": f"a{i}", "encoding": "pcm16",
                                    "sample_rate": 16000, "channels": 1,
                                    "audio": base64.b64encode(pcm[i:i + 2560]).decode()}))
            types = []
            while "voicechat.metrics" not in types or len(types) < 4:
                types.append(json.loads(ws.recv(timeout=10))["type"])
            assert "voicechat.metrics" in types
