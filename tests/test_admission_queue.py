"""The admission queue: the FIFO's bookkeeping (exact and as a hypothesis property) and, over real
sockets, 2x oversubscription, a timeout, a full queue and a client that leaves while queued."""

from __future__ import annotations

import base64
import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.server.admission import Admission

from .server_fixture import RawClient, running_app

UPDATE = {"type": "session.update", "event_id": "u1", "session": {"instructions": "Be brief."}}
SPEECH = render_speech("hello") + bytes(12 * INPUT_FRAME_BYTES)  # the model-owned end of turn answers it
QUEUE = ("session.queued", "session.queue_update", "session.queue_done")


# ---------------------------------------------------------------------------------------------------- bookkeeping


def test_the_queue_is_first_come_first_served_and_a_freed_slot_goes_to_its_head():
    admission = Admission(1, queue_capacity=2)
    told: list[str] = []
    slot = admission.try_acquire()
    a = admission.enqueue(lambda: told.append("a"))
    b = admission.enqueue(lambda: told.append("b"))
    assert (a.position, b.position) == (1, 2)
    assert admission.enqueue(lambda: None) is None  # full
    assert admission.try_acquire() is None  # a newcomer never overtakes the queue
    slot.release()
    assert a.slot is not None and a.position == 0 and b.position == 1 and told == ["a", "b"]
    assert admission.active == 1 and list(admission.waiting) == [b]
    admission.leave(b)
    assert not admission.waiting and told == ["a", "b"]  # nobody behind b to tell
    a.slot.release()
    assert admission.active == 0 and admission.try_acquire() is not None


def test_leaving_moves_the_ones_behind_up():
    admission = Admission(1, queue_capacity=3)
    admission.try_acquire()
    told: list[int] = []
    tickets = [admission.enqueue(lambda i=i: told.append(i)) for i in range(3)]
    admission.leave(tickets[0])
    assert [t.position for t in tickets[1:]] == [1, 2] and told == [1, 2]
    admission.leave(tickets[0])  # twice: nothing happens


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(st.sampled_from(["acquire", "enqueue", "leave", "release"]), st.integers(0, 20)),
                max_size=80), st.integers(1, 3), st.integers(0, 4))
def test_slots_and_positions_stay_consistent(ops, capacity, queue_capacity):
    admission = Admission(capacity, queue_capacity=queue_capacity)
    slots, tickets, changes = [], [], {}
    for op, k in ops:
        if op == "acquire":
            slot = admission.try_acquire()
            assert (slot is None) == (admission.active - (slot is not None) >= capacity or bool(admission.waiting))
            if slot is not None:
                slots.append(slot)
        elif op == "enqueue":
            ticket = admission.enqueue(lambda n=len(changes): changes.__setitem__(n, changes.get(n, 0) + 1))
            if ticket is not None:
                changes.setdefault(len(tickets), 0)
                tickets.append(ticket)
        elif op == "leave" and tickets:
            admission.leave(tickets[k % len(tickets)])
        elif op == "release" and slots:
            slots.pop(k % len(slots)).release()
        for t in tickets:  # admitted tickets hand their slot to the test
            if t.slot is not None:
                slots.append(t.slot)
                t.slot = None
        assert admission.active == sum(1 for s in slots if not s.released) <= capacity
        assert [t.position for t in admission.waiting] == list(range(1, len(admission.waiting) + 1))
        assert not admission.waiting or admission.active == capacity  # nobody waits beside a free slot


# ---------------------------------------------------------------------------------------------------- over sockets


def health(url: str) -> dict:
    return json.load(urllib.request.urlopen(url.replace("ws://", "http://") + "/health", timeout=10))


def usage(url: str) -> dict:
    return json.load(urllib.request.urlopen(url.replace("ws://", "http://") + "/v1/usage", timeout=10))


def greet(c: RawClient) -> list[dict]:
    """Send the first message; receive the queue events (if any) up to session.created."""
    c.send(UPDATE)
    return c.recv_until(lambda e: e["type"] in ("session.created", "session.queued", "error"))


def test_twice_oversubscribed_every_client_gets_its_turn_in_queue_order():
    """--max-sessions 4 --admission-queue 8: twelve clients at once; all twelve complete a turn, the queued ones
    see their positions fall to queue_done, none is lost."""
    with running_app(ServerConfig.simulator(max_sessions=4, admission_queue=8, admission_timeout_s=120)) as (url, _):
        everyone_in = threading.Barrier(12, timeout=60)

        def client(i: int) -> tuple[list[dict], str]:
            c = RawClient(url + "/v1/duplex", timeout=60)
            try:
                first = greet(c)
                everyone_in.wait()  # no session may end before all twelve are admitted or queued
                queue = [e for e in first if e["type"] in QUEUE]
                if first[-1]["type"] == "session.queued":
                    queue += [e for e in c.recv_until(lambda e: e["type"] == "session.created") if e["type"] in QUEUE]
                c.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(SPEECH).decode()})
                events = c.recv_until(lambda e: e["type"] == "response.done")
                transcript = [e["transcript"] for e in events if e["type"] == "response.output_audio_transcript.done"]
                c.send({"type": "session.close"})
                c.recv_until(lambda e: e["type"] == "session.closed")
                assert c.close_code() == 1000  # the slot is free before the close frame is written
                return queue, transcript[0]
            finally:
                c.close()

        with ThreadPoolExecutor(12) as pool:
            results = list(pool.map(client, range(12)))
        assert [t for _, t in results] == ["You said: hello."] * 12
        queued = [q for q, _ in results if q]
        assert len(queued) == 8  # four slots: the other eight waited
        assert sorted(q[0]["position"] for q in queued) == list(range(1, 9))
        for q in queued:
            types, positions = [e["type"] for e in q], [e["position"] for e in q]
            assert types[0] == "session.queued" and types[-1] == "session.queue_done"
            assert set(types[1:-1]) <= {"session.queue_update"}
            assert positions == sorted(positions, reverse=True) and len(set(positions)) == len(positions)
            assert positions[-1] == 0
        assert health(url)["active_sessions"] == 0
        book = usage(url)["sessions"]
        assert book["admitted"] == {"tiered": 12} and book["rejected"] == {} and book["live"] == 0


def test_a_queued_client_that_leaves_is_gone_at_once_and_a_timeout_gets_the_busy_answer():
    config = ServerConfig.simulator(max_sessions=1, admission_queue=2, admission_timeout_s=3.0)
    with running_app(config) as (url, _):
        holder = RawClient(url + "/v1/duplex")
        assert greet(holder)[-1]["type"] == "session.created"
        leaver = RawClient(url + "/v1/duplex")
        assert [e["position"] for e in greet(leaver)] == [1]
        waiter = RawClient(url + "/v1/duplex")
        first = greet(waiter)[-1]
        assert (first["type"], first["position"], first["estimated_wait_s"]) == ("session.queued", 2, None)
        third = RawClient(url + "/v1/duplex")  # the queue holds two
        refused = greet(third)[-1]
        assert refused["type"] == "error" and refused["error"]["code"] == "resource_exhausted"
        assert "queue full" in refused["error"]["message"] and third.close_code() == 1013
        leaver.close()  # it leaves the queue at once: the one behind it moves up
        update = waiter.recv()
        assert (update["type"], update["position"]) == ("session.queue_update", 1)
        late = waiter.recv()  # the holder keeps its slot: the wait ends with the busy answer
        assert late["type"] == "error" and late["error"]["code"] == "resource_exhausted"
        assert "no slot within 3 s" in late["error"]["message"] and waiter.close_code() == 1013
        holder.send({"type": "session.close"})
        holder.recv_until(lambda e: e["type"] == "session.closed")
        holder.close_code()
        assert health(url)["active_sessions"] == 0
        assert usage(url)["sessions"]["rejected"] == {"tiered": {"queue_full": 1, "queue_timeout": 1}}


def test_a_freed_slot_admits_the_head_and_v3_never_queues():
    with running_app(ServerConfig.simulator(max_sessions=1, admission_queue=1)) as (url, _):
        holder = RawClient(url + "/v1/duplex")
        greet(holder)
        v3 = RawClient(url + "/v1/voicechat")  # the strict contract: busy at once, never a queue event
        assert v3.recv()["error"]["code"] == "server_busy" and v3.close_code() == 1013
        queued = RawClient(url + "/v1/duplex")
        assert greet(queued)[-1]["type"] == "session.queued"
        holder.send({"type": "session.close"})
        events = queued.recv_until(lambda e: e["type"] == "session.created")
        assert [e["type"] for e in events] == ["session.queue_done", "session.created"]
        caps = events[-1]["session"]["capabilities"]
        assert caps["supports_admission_queue"] is True and caps["admission_queue_max"] == 1
        assert queued.recv()["type"] == "session.updated"  # the first message, held while it waited, then applied
        queued.send({"type": "session.close"})
        queued.recv_until(lambda e: e["type"] == "session.closed")


def test_what_a_queued_client_sends_beyond_the_pump_waits_in_the_socket_and_none_is_lost():
    config = ServerConfig.simulator(max_sessions=1, admission_queue=1, max_inbox_messages=4)
    with running_app(config) as (url, _):
        holder = RawClient(url + "/v1/duplex")
        greet(holder)
        queued = RawClient(url + "/v1/duplex")
        assert greet(queued)[-1]["type"] == "session.queued"
        for i in range(6):  # more than the pump holds while queued: each is owed its typed error
            queued.send({"type": "no.such.event", "event_id": f"e{i}"})
        holder.send({"type": "session.close"})
        echoed: list[str] = []

        def answered(e: dict) -> bool:
            if e["type"] == "error":
                echoed.append(e["error"]["event_id"])
            return len(echoed) == 6

        queued.recv_until(answered)
        assert echoed == [f"e{i}" for i in range(6)]  # all six, in order (the pump held 4, the socket the rest)
        queued.send({"type": "session.close"})
        queued.recv_until(lambda e: e["type"] == "session.closed")


@pytest.mark.parametrize("ws", ["ours", "websockets-sansio"])
def test_a_queued_client_sends_no_more_than_a_first_message_and_an_admitted_one_the_dialects_size(ws):
    """While it waits, a client has no session: a message over QUEUED_MAX_MESSAGE_BYTES closes it with 1009 (our
    protocol refuses it from its header, the host under another uvicorn protocol) and frees its place; once
    admitted, the dialect's own size holds."""
    from vllm_omni_voicechat.server.inprocess import InProcessServer
    from vllm_omni_voicechat.wire.limits import QUEUED_MAX_MESSAGE_BYTES

    big = {"type": "no.such.event", "event_id": "big", "pad": "x" * QUEUED_MAX_MESSAGE_BYTES}
    kw = {} if ws == "ours" else {"ws": ws}
    with InProcessServer(ServerConfig.simulator(max_sessions=1, admission_queue=2), **kw) as server:
        url = server.url
        holder = RawClient(url + "/v1/duplex")
        greet(holder)
        flooder = RawClient(url + "/v1/duplex")
        assert greet(flooder)[-1]["position"] == 1
        patient = RawClient(url + "/v1/duplex")
        assert greet(patient)[-1]["position"] == 2
        flooder.send(big)
        assert flooder.close_code() == 1009
        update = patient.recv()
        assert (update["type"], update["position"]) == ("session.queue_update", 1)  # its place is free at once
        holder.send({"type": "session.close"})
        patient.recv_until(lambda e: e["type"] == "session.updated")
        patient.send(big)  # admitted: a tiered message may be 16 MiB
        error = patient.recv_until(lambda e: e["type"] == "error")[-1]["error"]
        assert (error["code"], error["event_id"]) == ("unknown_event", "big")
        patient.send({"type": "session.close"})
        patient.recv_until(lambda e: e["type"] == "session.closed")
