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
from hypothesis import given, settings
from hypothesis import strategies as st
from uvicorn.server import ServerState
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.sync.client import connect
from websockets.uri import parse_uri

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.server.inprocess import InProcessServer
from vllm_omni_voicechat.server.uvicorn import READ_AHEAD_MESSAGES, AbortableWebSockets, protocol_for

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


async def _connected(*, max_size: int | None = None, pipelined: bytes = b""
                     ) -> tuple[AbortableWebSockets, RecordingTransport, ClientProtocol]:
    accepted = asyncio.Event()

    async def accepting_app(scope, receive, send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        accepted.set()
        await asyncio.Event().wait()  # never reads: the test plays the app's receive itself

    config = uvicorn.Config(accepting_app, ws=AbortableWebSockets, log_level="warning",
                            **({"ws_max_size": max_size} if max_size else {}))
    config.load()
    protocol = AbortableWebSockets(config, ServerState(), {}, _loop=asyncio.get_running_loop())
    transport = RecordingTransport()
    protocol.connection_made(transport)
    client = ClientProtocol(parse_uri("ws://127.0.0.1:8000/v1/realtime"))
    client.send_request(client.connect())
    protocol.data_received(b"".join(client.data_to_send()) + pipelined)
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


def _outbox(gone: list[bool]):
    """An outbox on a socket of our protocol (``_connected``'s); ``gone`` records its client leaving."""
    from starlette.websockets import WebSocket

    from vllm_omni_voicechat.server.outbox import Outbox

    scope = {"type": "websocket", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000), "path": "/",
             "headers": [], "query_string": b""}
    return Outbox(WebSocket(scope, None, None), ServerConfig.simulator(), on_overflow=lambda: None,
                  on_gone=lambda outbox: gone.append(True))


def test_the_outbox_writes_a_steps_events_at_once_and_waits_out_a_full_transport_buffer():
    """Events queued in one step leave in one write once the step yields (no writer task wakes for them); while
    the transport is above its high-water mark nothing is written, and everything queued meanwhile leaves in
    order, in one write, when it drains."""
    from vllm_omni_voicechat.server.outbox import BATCH_EVENTS

    async def scenario() -> None:
        protocol, transport, client = await _connected()
        gone: list[bool] = []
        outbox = _outbox(gone)
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


def test_a_backed_up_outbox_keeps_its_events_in_backlogs_and_writes_them_in_order_byte_for_byte():
    """Behind a transport that takes nothing, events past ``BACKLOG_AFTER`` entries are kept as UTF-8 in backlogs of
    at most ``BACKLOG_BYTES`` (a few objects for thousands of events, not a string each), counted and bounded as
    events all the same; when the transport drains, every event leaves in order, byte for byte (non-ASCII too),
    and the trace sees each one as text."""
    from vllm_omni_voicechat.server.outbox import BACKLOG_AFTER, BACKLOG_BYTES, _Backlog

    async def scenario() -> None:
        protocol, transport, client = await _connected()
        gone: list[bool] = []
        outbox = _outbox(gone)
        seen: list[str] = []
        outbox._trace = type("Seen", (), {"server_event": lambda self, text: seen.append(text)})()
        protocol.pause_writing()
        texts = ['{"type":"e","n":%d,"t":"%s"}' % (i, "é" * (i % 7)) for i in range(5_000)]
        for text in texts:
            assert outbox.put(text)
        await _loop_turns(3)
        assert transport.writes == []
        entries = list(outbox._queue)
        assert all(type(e[0]) is str for e in entries[:BACKLOG_AFTER])
        backlogs = [e for e in entries[BACKLOG_AFTER:]]
        assert backlogs and all(type(e[0]) is _Backlog and len(e[0].data) == e[1] <= BACKLOG_BYTES
                                for e in backlogs)
        assert len(entries) < 100
        sizes = [len(t.encode()) for t in texts]
        assert (outbox.queued_events, outbox.queued_bytes) == (5_000, sum(sizes))
        assert (outbox.peak_events, outbox.peak_bytes) == (5_000, sum(sizes))
        assert outbox.put('{"type":"forced"}', force=True)  # a forced event is never in a backlog
        assert type(outbox._queue[-1][0]) is str
        protocol.resume_writing()
        await _loop_turns(5)
        written = [t for data in transport.writes for t in _frames(client, data)]
        assert written == texts + ['{"type":"forced"}'] == seen
        assert (outbox.sent_events, outbox.queued_events, outbox.queued_bytes) == (5_001, 0, 0) and not gone
        outbox.abort()
        protocol.connection_lost(None)

    asyncio.run(scenario())


def test_a_backed_up_outbox_overflows_at_its_event_bound_counting_events_in_backlogs():
    from vllm_omni_voicechat.server.outbox import Outbox

    async def scenario() -> None:
        protocol, transport, client = await _connected()
        from starlette.websockets import WebSocket

        scope = {"type": "websocket", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000), "path": "/",
                 "headers": [], "query_string": b""}
        overflows: list[bool] = []
        config = dataclasses.replace(ServerConfig.simulator(), max_outbound_events=1_000)
        outbox = Outbox(WebSocket(scope, None, None), config, on_overflow=lambda: overflows.append(True),
                        on_gone=lambda outbox: None)
        protocol.pause_writing()
        assert all(outbox.put('{"n":%d}' % i) for i in range(1_000))
        assert overflows == [] and outbox.queued_events == 1_000
        assert not outbox.put('{"n":1000}')
        assert overflows == [True] and outbox.queued_events == 1_000
        outbox.discard()  # the head event stays (as ever); a backlog is never half in the transport: all of it goes
        assert (outbox.queued_events, outbox.queued_bytes) == (1, len('{"n":0}'))
        outbox.abort()
        protocol.connection_lost(None)

    asyncio.run(scenario())


def test_an_outbox_whose_client_left_ends_its_writer():
    """A write that fails (the client left) is a disconnect: the session is told (``on_gone``) and the writer task
    ends, instead of waiting forever for events that will never come, a pending task whose frame holds the outbox
    and its socket for the collector to find (the server's collector is off between backstops: server/heap.py)."""
    async def scenario() -> None:
        protocol, transport, client = await _connected()
        gone: list[bool] = []
        outbox = _outbox(gone)
        await _loop_turns(2)  # the writer waits for work
        protocol.connection_lost(None)  # the client left: the next write fails
        assert outbox.put('{"type":"a"}')
        await _loop_turns(3)
        assert gone == [True] and outbox.gone
        assert outbox._task.done()  # the writer ended (it returns when cancelled: no error holds its frame)

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


# --- inbound framing: ours against websockets' parser -------------------------------------------------------------

def _client_frames(ops: list[tuple], close: bool = False) -> tuple[bytes, list[int]]:
    """A client's wire bytes for ``ops`` (masked, as clients send) and where our framing reads one frame at a time."""
    client = ClientProtocol(parse_uri("ws://127.0.0.1:8000/v1/realtime"), max_size=None)
    client.send_request(client.connect())
    client.data_to_send()
    client.state = State.OPEN
    frames: list[bytes] = []
    for op in ops:
        frames += client.data_to_send()
        kind = op[0]
        if kind == "text":
            client.send_text(op[1].encode())
        elif kind == "binary":
            client.send_binary(op[1])
        elif kind == "fragments":  # a text message in pieces, a ping between the first two
            pieces = op[1]
            client.send_text(pieces[0].encode(), fin=len(pieces) == 1)
            for i, piece in enumerate(pieces[1:], 1):
                if i == 1:
                    client.send_ping(b"mid")
                client.send_continuation(piece.encode(), fin=i == len(pieces) - 1)
        elif kind == "ping":
            client.send_ping(op[1])
        elif kind == "bad_utf8":
            client.send_frame(Frame(Opcode.TEXT, b"\xff\xfe" if not op[1:] else b"a" * 70_000 + b"\xff"))
        elif kind == "text_inside_fragments":  # a protocol error: a new message before the last one's end
            client.send_frame(Frame(Opcode.TEXT, b"fir", fin=False))
            client.send_frame(Frame(Opcode.TEXT, b"second"))
        elif kind == "unmasked":  # a protocol error from a client
            frames.append(b"\x81\x02hi")
    if close:
        client.send_close(1000, "bye")
    frames += client.data_to_send()  # one bytes object a frame
    # Frames are read one at a time until the first that is not a whole masked text, binary or control frame (a
    # fragment, an unmasked frame): from its start websockets gets the reads as they come.
    ends = [0]
    for f in frames:
        if f[0] not in (0x81, 0x82, 0x88, 0x89, 0x8A) or not f[1] & 0x80:
            break
        ends.append(ends[-1] + len(f))
    return b"".join(frames), ends


async def _served(stream: bytes, cuts: list[int], ours: bool, max_size: int | None = None):
    """What the app and the wire see when ``stream`` arrives cut at ``cuts``: messages taken by the receiver, ASGI
    events queued, bytes written back."""
    protocol, transport, _ = await _connected(max_size=max_size)
    if not ours:
        protocol._frames = None  # websockets reads everything, as without our framing
    taken: list = []
    protocol.receiver = taken.append
    edges = [0] + sorted(c for c in set(cuts) if 0 < c < len(stream)) + [len(stream)]
    for a, b in zip(edges, edges[1:]):
        try:
            protocol.data_received(stream[a:b])
        except Exception as exc:  # uvicorn's own: invalid UTF-8 and a close in one read (InvalidState)
            taken.append(("raised", type(exc).__name__))
            break
    queued = []
    while not protocol.queue.empty() and not (queued and queued[-1]["type"] == "websocket.disconnect"):
        queued.append(protocol.queue.get_nowait())  # up to the first disconnect: uvicorn repeats it per later read
    written = b"".join(transport.writes)
    protocol.connection_lost(None)
    return taken, queued, written


TEXTS = st.text(max_size=40) | st.sampled_from(["x" * 125, "y" * 126, "é" * 40_000, "z" * 70_000])
OPS = st.lists(st.one_of(
    st.tuples(st.just("text"), TEXTS),
    st.tuples(st.just("binary"), st.binary(max_size=300) | st.just(bytes(range(256)) * 300)),
    st.tuples(st.just("fragments"), st.lists(st.text(max_size=10), min_size=1, max_size=4)),
    st.tuples(st.just("ping"), st.binary(max_size=10)),
    st.tuples(st.just("bad_utf8")) | st.tuples(st.just("bad_utf8"), st.just("large")),
    st.tuples(st.just("text_inside_fragments")),
    st.tuples(st.just("unmasked")),
), max_size=8)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, close=st.booleans(), cuts=st.lists(st.integers(0, 200_000), max_size=12), data=st.data())
def test_our_framing_delivers_what_websockets_parser_delivers(ops, close, cuts, data):
    """Any mix of texts (the 7/16/64-bit length classes), binaries, fragmented messages with a ping inside, pings,
    invalid UTF-8, protocol errors (a message inside a fragmented one, an unmasked frame) and a close, cut anywhere:
    the receiver takes the same messages in the same order, the same ASGI events are queued (up to the first
    disconnect) and the same bytes go back (pongs, close replies) as when websockets parses it all, read a frame at
    a time up to the first fragment or malformed frame (ours hands websockets whole frames one by one: what uvicorn
    does between two frames of one read, it does as after two reads), as read from there."""
    stream, ends = _client_frames(ops, close)
    cuts = cuts + data.draw(st.lists(st.integers(0, len(stream)), max_size=6))
    assert asyncio.run(_served(stream, cuts, ours=True)) == asyncio.run(_served(stream, cuts + ends, ours=False))


@pytest.mark.parametrize("limit,size", [(1_000, 2_000), (100, 120)])  # a 16-bit and a 7-bit length over the limit
def test_a_frame_over_the_size_limit_is_websockets_to_refuse(limit, size):
    """A header announcing more than the limit hands everything to websockets, which closes with 1009."""
    stream, ends = _client_frames([("text", "ok"), ("text", "x" * size), ("text", "after")])
    ours = asyncio.run(_served(stream, [5, 30], ours=True, max_size=limit))
    assert ours == asyncio.run(_served(stream, [5, 30] + ends[:2], ours=False, max_size=limit))  # "ok" alone
    taken, _, written = ours
    assert taken == ["ok"] and written[0] == 0x88 and written[2:4] == (1009).to_bytes(2, "big")  # close, 1009


def test_a_client_still_sending_a_refused_frame_reads_the_close_not_a_reset():
    """An oversized frame is refused from its header (1009) while the client is still sending it: the server
    half-closes and discards the rest until the client closes, so the client reads the close frame and a clean end
    of stream. (Closing at once left the client's bytes unread: the kernel answered them with a reset, the client's
    send failed with a broken pipe and it could lose the close frame: a flaky test found it.)"""
    import socket

    from vllm_omni_voicechat.wire.limits import V3_MAX_MESSAGE_BYTES

    with InProcessServer(ServerConfig.simulator()) as server:
        uri = parse_uri(server.url + "/v1/voicechat")
        client = ClientProtocol(uri, max_size=None)
        client.send_request(client.connect())
        with socket.create_connection((uri.host, uri.port), timeout=30) as sock:
            sock.sendall(b"".join(client.data_to_send()))
            while client.state is not State.OPEN:
                client.receive_data(sock.recv(65536))
            size = 2 * V3_MAX_MESSAGE_BYTES
            head = bytes((0x81, 0xFF)) + size.to_bytes(8, "big") + bytes(4)  # masked with a zero mask
            sock.sendall(head + b"x" * 65536)
            close = None
            while close is None:
                client.receive_data(sock.recv(65536))
                close = next((e for e in client.events_received()
                              if isinstance(e, Frame) and e.opcode == Opcode.CLOSE), None)
            assert int.from_bytes(close.data[:2], "big") == 1009
            sock.sendall(b"x" * (size - 65536))  # the rest of the refused frame: discarded, not reset
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(65536) == b""  # a clean end of stream


def test_bytes_after_the_opening_request_leave_every_frame_to_websockets():
    """A client that sends frames before it has the 101 (pipelined with the request): no framing of ours."""
    async def scenario() -> None:
        protocol, transport, _ = await _connected(pipelined=b"\x81\x80\x00\x00\x00\x00")  # an empty masked text
        assert protocol._frames is None
        protocol.connection_lost(None)

    asyncio.run(scenario())


def test_the_app_finds_a_live_connections_protocol_and_not_a_closed_ones():
    async def scenario() -> None:
        protocol, _, _ = await _connected()

        class Socket:
            scope = {"client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}

        assert protocol_for(Socket()) is protocol
        protocol.connection_lost(None)
        assert protocol_for(Socket()) is None

    asyncio.run(scenario())


@settings(max_examples=200, deadline=None)
@given(payload=st.binary(max_size=64) | st.integers(0, 70_000).map(lambda n: bytes(range(256)) * (n // 256) + b"x" * (n % 256)),
       lead=st.integers(0, 7), mask=st.binary(min_size=4, max_size=4))
def test_unmasking_in_place_is_websockets_unmasking(payload, lead, mask):
    """A large frame is unmasked where it lies in the partial buffer (any offset, any length): the same bytes as
    websockets' ``apply_mask``, and nothing around them touched."""
    from websockets.frames import apply_mask

    from vllm_omni_voicechat.server.uvicorn import unmask_in_place

    buffer = bytearray(b"\x01" * lead + apply_mask(payload, mask) + b"\x02" * 3)
    view = unmask_in_place(buffer, lead, lead + len(payload), mask)
    assert bytes(view) == payload
    view.release()
    assert buffer[:lead] == b"\x01" * lead and buffer[lead + len(payload):] == b"\x02" * 3
