"""Backpressure at the edge (docs/reliability.md, "Backpressure"): a stalled reader is bounded and handled by its
session's policy while another session keeps producing its response; an input flood is refused with a typed error
and the inbox stays within its bound.

The stalled reader is a raw TCP WebSocket client with a tiny receive buffer that stops reading after the
handshake, so the server's writes back up for real.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import socket
import time

import pytest

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.server.uvicorn import transport_for as asgi_transport
from vllm_omni_voicechat.shell.aio import SessionShell
from vllm_omni_voicechat.sim.model import SimBehaviour, SimulatorModel
from vllm_omni_voicechat.wire.transport import refused_event_id

from .server_fixture import RawClient, SocketClient, running_app
from .test_tiered_server import GatedModel

BOUND_EVENTS = 1024
BOUND_BYTES = 192 << 10  # ~3 s of the endless response's events: the bytes bound trips first


def StalledClient(url: str) -> SocketClient:
    """A raw WebSocket client with a small receive buffer: its socket is read only when the test asks."""
    return SocketClient(url, rcvbuf=4096)


def append(pcm: bytes, event_id: str = "a") -> dict:
    return {"type": "input_audio_buffer.append", "event_id": event_id, "encoding": "pcm16", "sample_rate": 16000,
            "channels": 1, "audio": base64.b64encode(pcm).decode()}


def barrier(kind: str, k: int, event_id: str) -> dict:
    return {"type": f"input_audio_buffer.{kind}", "event_id": event_id, "client_turn_id": k}


UPDATE = {"type": "session.update", "event_id": "u1", "session": {"protocol_version": 3, "instructions": "Be brief."}}
SILENCE_1S = bytes(INPUT_FRAME_BYTES * 12)


def first_session_endless(**kw) -> ServerConfig:
    """The first session's model speaks forever (the stalled reader's endless output); later ones behave."""
    behaviours = itertools.chain([SimBehaviour(endless_response=True, prefill_delay_s=0.02)],
                                 itertools.repeat(SimBehaviour(prefill_delay_s=0.02)))
    return ServerConfig(model_factory=lambda: SimulatorModel(next(behaviours)), settlement_blank_frames=3,
                        max_outbound_events=BOUND_EVENTS, max_outbound_bytes=BOUND_BYTES,
                        outbound_close_timeout_s=0.5, **kw)


def wait_until(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)  # ok: the server runs in another thread; its state is only observable by polling
    return value


def flood_until_refused(client: RawClient, shell, model: GatedModel, flood: list[str]) -> None:
    """Sends ``flood`` while the model is held mid-step: the shell's inbox fills, the next events are refused
    (their refusals wait in order behind the inbox), the reader then waits; releases the model once a refusal
    was counted."""
    assert model.held.wait(10)
    for eid in flood:
        client.send({"type": "flood.ping", "event_id": eid})
    wait_until(lambda: shell.refused > 0)
    model.release()


def shrink_server_send_buffer(app, session_id: str) -> None:
    """Pin the server-side socket's kernel send buffer small (no autotuning to MiBs), so the server's own bound
    is what a stalled reader meets within a second or two."""
    outbox = wait_until(lambda: app.host.outbox(session_id))
    transport = asgi_transport(outbox.websocket)
    transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)


def stats_of(app, session_id: str) -> dict | None:
    return next((s for s in list(app.host.backpressure) if s["session_id"] == session_id), None)


def stalled_and_blocked(app, session_id: str) -> bool:
    outbox = app.host.outbox(session_id)
    return outbox is not None and outbox.queued_events >= 2  # the writer is stuck on the first one


def v3_turn(c: RawClient, text: str, k: int) -> list[dict]:
    c.send(barrier("turn_start", k, f"s{k}"))
    c.send(append(render_speech(text)))
    c.send(barrier("commit", k, f"c{k}"))
    return c.recv_until(lambda e: e["type"] == "response.done")


def test_v3_stalled_reader_fails_its_session_while_another_session_answers():
    with running_app(first_session_endless()) as (url, app):
        stalled = StalledClient(url + "/v1/voicechat")
        sid = stalled.recv_type("session.created")["session_id"]
        shrink_server_send_buffer(app, sid)
        stalled.send(UPDATE)
        stalled.recv_type("session.updated")
        stalled.send(barrier("turn_start", 1, "s1"))
        stalled.send(append(render_speech("tell me a story")))
        stalled.send(barrier("commit", 1, "c1"))
        # From here on the stalled client never reads; its endless response backs up on the server.
        wait_until(lambda: stalled_and_blocked(app, sid) or stats_of(app, sid))

        other = RawClient(url + "/v1/voicechat")
        assert other.recv()["type"] == "session.created"
        other.send(UPDATE)
        other.recv_type("session.updated")
        events = v3_turn(other, "hello", 1)
        assert stats_of(app, sid) is None or stats_of(app, sid)["outbound_overflows"] == 1
        done = events[-1]
        assert done["response_id"] == next(e for e in events if e["type"] == "response.created")["response_id"]
        assert done["status"] == "completed"
        pcm = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
        assert decode_speech(pcm, 22050) == "You said: hello."

        # The stalled session keeps producing until its bound trips: then it fails and its socket is dropped.
        stats = wait_until(lambda: stats_of(app, sid))
        assert stats["outbound_overflows"] == 1
        assert stats["peak_outbound_events"] <= BOUND_EVENTS and stats["peak_outbound_bytes"] <= BOUND_BYTES
        assert sid not in app.live and app.admission.active == 1
        with pytest.raises(OSError):  # the aborted connection: reset, or EOF after what the kernel had buffered
            while True:
                event = stalled.recv()
                assert event["type"] != "<close>" or event["code"] == 1011
        stalled.close()

        assert [e["type"] for e in v3_turn(other, "again", 2)][-1] == "response.done"  # still served
        other.close()
        assert app.usage.ended[("v3", "output_backpressure")] == 1  # not counted as the client leaving


def test_a_reader_that_stopped_is_found_by_its_acknowledgements_before_any_buffer_fills():
    """A quiet v3 session (metrics events only) whose client stops reading: the kernel's send buffer and the
    transport's would take minutes to fill at ~5 KB/s, so the transport never pauses here (its high-water mark is
    set out of reach). The peer's acknowledgements stop once its receive buffer is full; nothing acknowledged for the
    stall timeout while bytes wait is a reader that stopped: the session fails as for the bounds."""
    config = ServerConfig(settlement_blank_frames=3, outbound_stall_timeout_s=1.0, outbound_close_timeout_s=0.5)
    with running_app(config) as (url, app):
        stalled = StalledClient(url + "/v1/voicechat")
        sid = stalled.recv_type("session.created")["session_id"]
        outbox = wait_until(lambda: app.host.outbox(sid))
        asgi_transport(outbox.websocket).set_write_buffer_limits(high=1 << 30)  # never pauses: only acks tell
        stalled.send(UPDATE)
        stalled.recv_type("session.updated")
        for _ in range(20):  # 240 frames: 240 metrics events, far more than the client's 4 KiB receive buffer
            stalled.send(append(SILENCE_1S))
        stats = wait_until(lambda: stats_of(app, sid))
        assert stats["outbound_overflows"] == 1
        assert app.usage.ended[("v3", "output_backpressure")] == 1
        stalled.close()


def test_ack_watch_says_stalled_only_after_nothing_was_acknowledged_for_the_timeout_while_bytes_waited():
    from vllm_omni_voicechat.server.acks import AckWatch

    w = AckWatch(10.0, now=0.0)
    assert not w.stalled(5.0, written=1000, buffered=0, unacked=200, queued=0)  # 800 acknowledged: progress
    assert not w.stalled(14.0, written=1000, buffered=0, unacked=200, queued=0)  # 9 s without: not yet
    assert w.stalled(15.0, written=1000, buffered=0, unacked=200, queued=0)
    assert not w.stalled(16.0, written=1500, buffered=300, unacked=150, queued=0)  # 1,050 now: progress again
    assert not w.stalled(40.0, written=1500, buffered=0, unacked=0, queued=0)  # nothing waits: an idle peer
    assert not w.stalled(45.0, written=1500, buffered=0, unacked=0, queued=70)  # the wait starts now
    assert not w.stalled(54.9, written=1500, buffered=0, unacked=0, queued=70)
    assert w.stalled(55.0, written=1500, buffered=0, unacked=0, queued=70)


def test_unacked_bytes_reads_the_kernels_send_queue_of_a_tcp_socket():
    from vllm_omni_voicechat.server.acks import unacked_bytes

    assert unacked_bytes(None) is None
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(server.getsockname())
        peer, _ = server.accept()
        with client, peer:
            assert unacked_bytes(peer) == 0
            peer.setblocking(False)
            sent = 0
            with pytest.raises(BlockingIOError):
                while True:  # the client never reads: its window closes, then our send buffer fills
                    sent += peer.send(bytes(65536))
            assert 0 < unacked_bytes(peer) <= sent


def test_tiered_stalled_reader_is_detached_and_resumes_from_the_journal():
    with running_app(first_session_endless(disconnect_grace_s=30.0)) as (url, app):
        stalled = StalledClient(url + "/v1/duplex?model=sim")
        created = stalled.recv_type("session.created")
        sid, token = created["session"]["id"], created["resume_token"]
        shrink_server_send_buffer(app, sid)
        pcm = render_speech("tell me a story") + SILENCE_1S
        stalled.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
        stalled.send({"type": "input_audio_buffer.commit"})
        last_seen = 0
        while (e := stalled.recv())["type"] != "response.created":
            last_seen = e.get("server_event_seq", last_seen)
        last_seen = e["server_event_seq"]
        # The client stops reading now; the endless response backs up until the bound detaches the socket.
        wait_until(lambda: app.live[sid].attachment.detached_overflows == 1)
        att = app.live[sid].attachment
        assert att.socket is None and att.protocol.detached_at is not None  # detached, alive within the grace
        assert att.peak_outbound_events <= BOUND_EVENTS and att.peak_outbound_bytes <= BOUND_BYTES
        stalled.close()

        resumed = RawClient(url + "/v1/duplex")
        resumed.send({"type": "session.resume", "session_id": sid, "resume_token": token,
                      "last_received_server_event_seq": last_seen})
        assert resumed.recv()["type"] == "session.resumed"
        seqs = [resumed.recv()["server_event_seq"] for _ in range(20)]
        assert seqs == list(range(last_seen + 1, last_seen + 21))  # the journal replays what the socket missed
        resumed.send({"type": "session.close"})
        resumed.recv_until(lambda e: e["type"] == "session.closed")
        resumed.close()


def test_v3_input_flood_is_refused_with_typed_errors_in_order_and_the_session_stays_usable():
    model = GatedModel()
    cfg = ServerConfig(model_factory=lambda: model, settlement_blank_frames=3, max_inbox_messages=8)
    with running_app(cfg) as (url, app):
        c = RawClient(url + "/v1/voicechat")
        sid = c.recv()["session_id"]
        c.send(UPDATE)
        c.recv_type("session.updated")
        c.send(barrier("turn_start", 1, "s1"))
        model.run_for(0)  # the next step waits at the gate
        pcm = render_speech("hello") + bytes(INPUT_FRAME_BYTES * 40)
        for i in range(0, len(pcm), 40_960):
            c.send(append(pcm[i:i + 40_960]))
        flood = [f"f{i}" for i in range(300)]
        flood_until_refused(c, app.live[sid].shell, model, flood)
        errors = c.recv_until(lambda e: e["type"] == "error" and e["error"]["client_event_id"] == flood[-1])
        errors = [e["error"] for e in errors if e["type"] == "error"]
        assert [e["client_event_id"] for e in errors] == flood  # every one answered once, in order
        refused = [e for e in errors if e["code"] == "input_backpressure"]
        assert refused and all(e == {"code": "input_backpressure", "message": "the receive queue is full; event refused",
                                     "fatal": False, "client_event_id": e["client_event_id"], "limit": 8}
                               for e in refused)
        assert {e["code"] for e in errors} == {"unsupported_event", "input_backpressure"}
        shell = app.live[sid].shell
        assert shell.peak_inbox_messages <= 8 and shell.pending_refusals == 0 and shell.inbox_messages == 0
        c.send(barrier("commit", 1, "c1"))
        done = c.recv_type("response.done")
        assert done["status"] == "completed"
        c.close()


def test_tiered_input_flood_gets_rate_limit_errors_with_their_seq():
    model = GatedModel()
    cfg = ServerConfig(model_factory=lambda: model, max_inbox_messages=4)
    with running_app(cfg) as (url, app):
        c = RawClient(url + "/v1/duplex?model=sim")
        sid = c.recv_type("session.created")["session"]["id"]
        model.run_for(0)  # the next step waits at the gate
        pcm = (render_speech("hello") + bytes(INPUT_FRAME_BYTES * 30))
        c.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
        flood = [f"f{i}" for i in range(100)]
        flood_until_refused(c, app.live[sid].shell, model, flood)
        events = c.recv_until(lambda e: e["type"] == "error" and e["error"].get("event_id") == flood[-1])
        errors = [e for e in events if e["type"] == "error"]
        assert [e["error"]["event_id"] for e in errors] == flood
        refused = [e["error"] for e in errors if e["error"]["code"] == "input_backpressure"]
        assert refused and all(e["type"] == "rate_limit_error" and e["retryable"] is True for e in refused)
        seqs = [e["server_event_seq"] for e in c.received if "server_event_seq" in e]
        assert seqs == list(range(1, len(seqs) + 1))  # refusals are journaled in the one seq order
        c.send({"type": "session.close"})
        c.recv_type("session.closed")
        c.close()


def test_shell_inbox_bounds_refusals_then_waits():
    """The shell alone: messages beyond the bound become refusals; beyond those the offer waits for room."""

    class Protocol:
        closed = False
        held_messages = 0
        tally = None

        def __init__(self) -> None:
            self.received: list[str] = []

        def receive(self, message, now, arrived=None):
            self.received.append(message)
            return []

    async def main():
        proto = Protocol()
        answered: list = []
        class Refusals:
            refusal_id = staticmethod(refused_event_id)

            def refuse(self, event_id, now):
                answered.append(event_id)
                return []

        shell = SessionShell(proto, SimulatorModel(), lambda item: None, max_inbox_messages=3,
                             max_inbox_bytes=1000, refusals=Refusals())
        results = [await shell.offer(json.dumps({"event_id": f"e{i}"})) for i in range(6)]
        assert results == [True, True, True, False, False, False]
        assert (shell.inbox_messages, shell.pending_refusals, shell.refused) == (3, 3, 3)
        blocked = asyncio.ensure_future(shell.offer(json.dumps({"event_id": "e6"})))
        await asyncio.sleep(0)  # ok: one loop turn, so the offer reaches its wait
        assert not blocked.done()  # both queues full: the reader waits (no growth)
        await shell._handle(shell._inbox.get_nowait())
        assert await blocked is True
        while not shell._inbox.empty():
            await shell._handle(shell._inbox.get_nowait())
        assert proto.received == ['{"event_id": "e0"}', '{"event_id": "e1"}', '{"event_id": "e2"}',
                                  '{"event_id": "e6"}']
        assert answered == ["e3", "e4", "e5"]
        big = "x" * 600
        assert await shell.offer(big) is True and await shell.offer(big) is False  # the byte bound
        assert shell.peak_inbox_messages == 3 and shell.peak_inbox_bytes <= 1000

    asyncio.run(main())


def test_v3_reader_that_stopped_with_room_left_fails_at_the_stall_timeout():
    """The bounds are far off (the defaults), but the transport takes nothing for the stall timeout: the session
    fails as if they had tripped (output_backpressure), without the minutes the bounds would take."""
    behaviours = itertools.chain([SimBehaviour(endless_response=True, prefill_delay_s=0.02)],
                                 itertools.repeat(SimBehaviour(prefill_delay_s=0.02)))
    cfg = ServerConfig(model_factory=lambda: SimulatorModel(next(behaviours)), settlement_blank_frames=3,
                       outbound_stall_timeout_s=1.0, outbound_close_timeout_s=0.5)
    with running_app(cfg) as (url, app):
        stalled = StalledClient(url + "/v1/voicechat")
        sid = stalled.recv_type("session.created")["session_id"]
        shrink_server_send_buffer(app, sid)
        stalled.send(UPDATE)
        stalled.recv_type("session.updated")
        stalled.send(barrier("turn_start", 1, "s1"))
        stalled.send(append(render_speech("tell me a story")))
        stalled.send(barrier("commit", 1, "c1"))  # and never reads again
        stats = wait_until(lambda: stats_of(app, sid))
        assert stats["outbound_overflows"] == 1
        assert stats["peak_outbound_bytes"] < cfg.max_outbound_bytes  # the time, not the bytes, tripped it
        assert sid not in app.live
        assert app.usage.ended[("v3", "output_backpressure")] == 1
        stalled.close()


def test_tiered_reader_that_stopped_with_room_left_is_detached_at_the_stall_timeout():
    """The tiered policy for the same stall: the socket is detached (resumable within the grace), not the session
    failed, and without the bounds having tripped."""
    behaviours = itertools.chain([SimBehaviour(endless_response=True, prefill_delay_s=0.02)],
                                 itertools.repeat(SimBehaviour(prefill_delay_s=0.02)))
    cfg = ServerConfig(model_factory=lambda: SimulatorModel(next(behaviours)), settlement_blank_frames=3,
                       outbound_stall_timeout_s=1.0, outbound_close_timeout_s=0.5, disconnect_grace_s=30.0)
    with running_app(cfg) as (url, app):
        stalled = StalledClient(url + "/v1/duplex?model=sim")
        created = stalled.recv_type("session.created")
        sid = created["session"]["id"]
        shrink_server_send_buffer(app, sid)
        pcm = render_speech("tell me a story") + SILENCE_1S
        stalled.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
        stalled.send({"type": "input_audio_buffer.commit"})
        stalled.recv_type("response.created")  # and never reads again
        wait_until(lambda: app.live[sid].attachment.detached_overflows == 1)
        att = app.live[sid].attachment
        assert att.socket is None and att.protocol.detached_at is not None  # detached, alive within the grace
        assert att.peak_outbound_bytes < cfg.max_outbound_bytes  # the time, not the bytes, tripped it
        stalled.close()
        resumed = RawClient(url + "/v1/duplex")
        resumed.send({"type": "session.resume", "session_id": sid, "resume_token": created["resume_token"],
                      "last_received_server_event_seq": 0})
        assert resumed.recv()["type"] == "session.resumed"
        resumed.send({"type": "session.close"})
        resumed.recv_until(lambda e: e["type"] == "session.closed")
        resumed.close()
