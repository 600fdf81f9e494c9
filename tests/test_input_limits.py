"""Input limits at the transport and before parsing, both dialects, on a real server: a message over its dialect's
size is refused while its header arrives (close 1009, nothing buffered), where our protocol serves and where it does
not; a message with too many JSON objects and arrays is refused undecoded with a typed recoverable error; typed
requests beyond those in flight are refused at once."""

from __future__ import annotations

import json
import socket
import threading
import time

from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.server.inprocess import InProcessServer
from vllm_omni_voicechat.wire.limits import (
    MAX_ERROR_MESSAGE_CHARS,
    MAX_JSON_CONTAINERS,
    TIERED_MAX_MESSAGE_BYTES,
    V3_MAX_MESSAGE_BYTES,
)

from .server_fixture import RawClient, SocketClient, running_app

V3_UPDATE = {"type": "session.update", "event_id": "u1",
             "session": {"protocol_version": 3, "instructions": "Be brief."}}


def wait_until(predicate, timeout: float = 10.0) -> None:
    """An awaited condition on the server's state (polled; fails after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.01)  # ok: polling the server thread's state (an awaited condition)


def padded(event: dict, size: int) -> str:
    """``event`` with a ``pad`` field making it exactly ``size`` bytes of JSON."""
    bare = json.dumps({**event, "pad": ""})
    return json.dumps({**event, "pad": "x" * (size - len(bare))})


def bomb(containers: int) -> str:
    return json.dumps({"type": "bogus.event", "event_id": "bomb", "a": [[] for _ in range(containers - 2)]})


# ---------------------------------------------------------------------------------------------------- size


def test_v3_message_over_its_size_is_refused_at_its_header_with_1009_and_frees_the_slot():
    with running_app(ServerConfig(max_sessions=1)) as (url, app):
        raw = SocketClient(url + "/v1/voicechat")
        opcode, payload = raw.recv_frame()
        assert opcode == 1 and json.loads(payload)["type"] == "session.created"
        raw.send_header(V3_MAX_MESSAGE_BYTES + 1)  # the payload never comes: refused before it is buffered
        assert raw.close_code() == 1009
        raw.close()
        wait_until(lambda: not app.live)  # the transport closed first; the session learns of it after
        c = RawClient(url + "/v1/voicechat")  # the one slot is free again
        assert c.recv()["type"] == "session.created"
        c.close()


def test_v3_message_of_exactly_its_size_is_taken():
    with running_app(ServerConfig()) as (url, _):
        c = RawClient(url + "/v1/voicechat")
        c.recv_type("session.created")
        c.send(padded({"type": "bogus.event", "event_id": "big"}, V3_MAX_MESSAGE_BYTES))
        error = c.recv_type("error")["error"]
        assert (error["code"], error["client_event_id"], error["fatal"]) == ("unsupported_event", "big", False)
        c.send(V3_UPDATE)
        c.recv_type("session.updated")
        c.close()


def test_v3_message_over_its_size_closes_with_1009_where_our_protocol_does_not_serve():
    """Under another uvicorn protocol (vLLM-Omni's server) the whole message arrives; the host refuses it."""
    with InProcessServer(ServerConfig(max_sessions=1), ws="websockets-sansio") as server:
        c = RawClient(server.url + "/v1/voicechat")
        c.recv_type("session.created")
        c.send(padded({"type": "bogus.event", "event_id": "big"}, V3_MAX_MESSAGE_BYTES + 1))
        assert c.close_code() == 1009
        wait_until(lambda: not server.voicechat.live)
        c2 = RawClient(server.url + "/v1/voicechat")
        assert c2.recv()["type"] == "session.created"
        c2.close()


def test_tiered_message_over_its_size_is_refused_at_its_header_with_1009():
    with running_app(ServerConfig()) as (url, _):
        raw = SocketClient(url + "/v1/duplex?autostart=1")
        raw.send_header(TIERED_MAX_MESSAGE_BYTES + 1)
        assert raw.close_code() == 1009
        raw.close()


def test_tiered_message_over_15_mib_gets_event_too_large_and_the_session_goes_on():
    with running_app(ServerConfig()) as (url, _):
        c = RawClient(url + "/v1/duplex")
        c.send({"type": "session.update", "session": {"instructions": "Be brief."}})
        c.recv_type("session.updated")
        c.send(padded({"type": "session.update"}, 15 * 1024 * 1024 + 1))
        error = c.recv_type("error")["error"]
        assert error["code"] == "event_too_large" and error["type"] == "invalid_request_error"
        c.send({"type": "session.update", "event_id": "after", "session": {"instructions": "Be brief."}})
        assert c.recv_type("session.updated")["event_id"] != "after"  # a server event id; the session answers
        c.close()


# ---------------------------------------------------------------------------------------------------- complexity


def configured_client(url: str, path: str) -> RawClient:
    """A client of the dialect at ``path`` whose session is configured and answering."""
    c = RawClient(url + path)
    if path == "/v1/voicechat":
        c.recv_type("session.created")
        return c
    c.send({"type": "session.update", "session": {"instructions": "Be brief."}})
    c.recv_type("session.updated")
    return c


def test_v3_json_with_too_many_containers_is_refused_undecoded_and_the_session_goes_on():
    with running_app(ServerConfig()) as (url, _):
        c = configured_client(url, "/v1/voicechat")
        c.send(bomb(MAX_JSON_CONTAINERS + 1))
        error = c.recv_type("error")["error"]
        assert error == {"code": "event_too_large", "fatal": False,
                         "message": f"more than {MAX_JSON_CONTAINERS} JSON objects and arrays; event refused",
                         "max_json_containers": MAX_JSON_CONTAINERS}
        c.send(bomb(MAX_JSON_CONTAINERS))  # at the limit: decoded, and answered as what it is
        error = c.recv_type("error")["error"]
        assert (error["code"], error["client_event_id"]) == ("unsupported_event", "bomb")
        c.send(V3_UPDATE)
        c.recv_type("session.updated")
        c.close()


def test_tiered_json_with_too_many_containers_is_refused_undecoded_and_the_session_goes_on():
    with running_app(ServerConfig()) as (url, _):
        c = configured_client(url, "/v1/duplex")
        c.send(bomb(MAX_JSON_CONTAINERS + 1))
        error = c.recv_type("error")["error"]
        assert error["code"] == "event_too_large" and error["type"] == "invalid_request_error"
        assert error["message"] == f"event has more than {MAX_JSON_CONTAINERS} JSON objects and arrays"
        c.send(bomb(MAX_JSON_CONTAINERS))
        assert c.recv_type("error")["error"]["code"] == "unknown_event"
        c.close()


# ---------------------------------------------------------------------------------------------------- the request head


def _closed_by_server(sock: socket.socket, timeout: float = 10.0) -> bool:
    """Whether the server closes ``sock`` (EOF or reset) within ``timeout``."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def test_a_connection_without_a_request_head_in_time_is_closed_and_a_slow_one_too():
    with InProcessServer(ServerConfig(), request_head_timeout_s=0.3) as server:
        silent = socket.create_connection(("127.0.0.1", server.port))
        slow = socket.create_connection(("127.0.0.1", server.port))
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # the head never ends
        assert _closed_by_server(silent) and _closed_by_server(slow)
        silent.close()
        slow.close()


def test_the_head_deadline_spares_requests_and_websocket_sessions():
    with InProcessServer(ServerConfig(), request_head_timeout_s=0.3) as server:
        c = RawClient(server.url + "/v1/voicechat")
        c.recv_type("session.created")
        request = socket.create_connection(("127.0.0.1", server.port))
        request.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        request.settimeout(10)
        assert request.recv(4096).startswith(b"HTTP/1.1 200")
        time.sleep(0.6)  # ok: past the head deadline, which must not touch either connection
        request.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive: uvicorn's own timer (5 s)
        assert request.recv(4096).startswith(b"HTTP/1.1 200")
        c.send(V3_UPDATE)
        c.recv_type("session.updated")
        c.close()
        request.close()


# ---------------------------------------------------------------------------------------------------- echoes


def test_an_error_quotes_at_most_1000_characters_of_what_the_client_sent():
    """An event type of 1 MB (lone surrogates included, which travel escaped at six bytes each) is quoted cut."""
    huge = "\ud800" + "t" * 900_000
    with running_app(ServerConfig()) as (url, _):
        v = RawClient(url + "/v1/voicechat")
        v.recv_type("session.created")
        v.send(json.dumps({"type": huge, "event_id": "e"}))
        raw = v.ws.recv(timeout=10)
        error = json.loads(raw)["error"]
        assert error["code"] == "unsupported_event" and len(error["message"]) == MAX_ERROR_MESSAGE_CHARS
        assert error["message"].endswith("…") and len(raw) < 8_000
        v.close()
        t = RawClient(url + "/v1/duplex")
        t.send({"type": "session.update", "session": {}})
        t.recv_type("session.updated")
        t.send(json.dumps({"type": huge, "event_id": "e"}))
        error = t.recv_type("error")["error"]
        assert error["code"] == "unknown_event" and len(error["message"]) == MAX_ERROR_MESSAGE_CHARS
        extra = {f"k{i:06}" * 20: 1 for i in range(2000)}  # unknown fields, named in the error
        t.send({"type": "session.update", "session": {"turn_detection": {"type": "server_vad", **extra}}})
        error = t.recv_type("error")["error"]
        assert error["code"] == "unsupported_turn_detection" and len(error["message"]) == MAX_ERROR_MESSAGE_CHARS
        t.close()


# ------------------------------------------------------------------------------------------- the prompt and the history


def _tool(i: int, description_chars: int) -> dict:
    return {"type": "function", "name": f"tool_{i}", "description": "d" * description_chars,
            "parameters": {"type": "object", "properties": {}}}


def test_instructions_and_tools_over_their_bounds_are_refused_and_the_session_goes_on():
    from vllm_omni_voicechat.session.tools import MAX_TOOL_BYTES, MAX_TOOLS_BYTES
    from vllm_omni_voicechat.wire.limits import MAX_INSTRUCTIONS_CHARS

    too_long = "i" * (MAX_INSTRUCTIONS_CHARS + 1)
    big_tool = [_tool(0, MAX_TOOL_BYTES)]
    many = [_tool(i, MAX_TOOL_BYTES - 200) for i in range(MAX_TOOLS_BYTES // MAX_TOOL_BYTES + 1)]
    with running_app(ServerConfig()) as (url, _):
        v = RawClient(url + "/v1/voicechat")
        v.recv_type("session.created")
        for session, code in (({"instructions": too_long}, "invalid_session_update"),
                              ({"tools": big_tool}, "invalid_tools"), ({"tools": many}, "invalid_tools")):
            v.send({"type": "session.update", "event_id": "u", "session": {"protocol_version": 3, **session}})
            error = v.recv_type("error")["error"]
            assert (error["code"], error["fatal"], error["client_event_id"]) == (code, False, "u"), error
        v.send({**V3_UPDATE, "session": {**V3_UPDATE["session"], "instructions": "i" * MAX_INSTRUCTIONS_CHARS}})
        v.recv_type("session.updated")  # at the bound: taken
        v.close()
        t = RawClient(url + "/v1/duplex")
        t.send({"type": "session.update", "session": {}})
        t.recv_type("session.updated")
        for session, param in (({"instructions": too_long}, "instructions"), ({"tools": big_tool}, "tools"),
                               ({"tools": many}, "tools")):
            t.send({"type": "session.update", "event_id": "u", "session": session})
            error = t.recv_type("error")["error"]
            assert error["type"] == "invalid_request_error" and error["param"] == param, error
        t.send({"type": "session.update", "session": {"tools": [_tool(0, 100)]}})
        assert [x["name"] for x in t.recv_type("session.updated")["session"]["tools"]] == ["tool_0"]
        t.close()


def test_a_client_item_over_its_bound_is_refused_and_the_history_is_bounded():
    from vllm_omni_voicechat.wire.tiered.items import MAX_ITEM_CONTENT_BYTES

    with running_app(ServerConfig()) as (url, _):
        t = RawClient(url + "/v1/duplex")
        t.send({"type": "session.update", "session": {}})
        t.recv_type("session.updated")
        t.send({"type": "conversation.item.create", "event_id": "big", "item": {
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "x" * MAX_ITEM_CONTENT_BYTES}]}})
        error = t.recv_type("error")["error"]
        assert (error["code"], error["event_id"], error["param"]) == ("event_too_large", "big", "item.content")
        t.send({"type": "conversation.item.create", "item": {
            "id": "small", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
        assert t.recv_type("conversation.item.done")["item"]["id"] == "small"
        t.close()


def test_the_item_store_forgets_the_oldest_items_beyond_its_count_and_client_bytes():
    from vllm_omni_voicechat.wire.tiered.items import ItemStore

    store = ItemStore(max_items=3, max_client_bytes=100)
    for i in range(5):
        store.add({"id": f"s{i}"})  # server items: counted, not sized
    assert [store.get(f"s{i}") is not None for i in range(5)] == [False, False, True, True, True]
    store.add({"id": "c1"}, client_bytes=60)
    store.add({"id": "c2"}, client_bytes=60)  # the count dropped s2 then s3; over the bytes, c1 goes too
    assert store.get("c1") is None and store.get("c2") is not None and len(store) == 2
    store.add({"id": "c3"}, client_bytes=30)
    assert store.get("c2") is not None and store.get("c3") is not None  # 90 bytes: within
    assert store.delete("c2") and store.get("c2") is None
    store.add({"id": "c4"}, client_bytes=70)  # 100: within, now that c2's bytes are gone
    assert store.get("c3") is not None and store.get("c4") is not None


def test_a_tiered_socket_waiting_for_its_first_message_takes_1_mib_then_the_dialect_s_size():
    from vllm_omni_voicechat.wire.limits import FIRST_MESSAGE_MAX_BYTES

    with running_app(ServerConfig()) as (url, _):
        raw = SocketClient(url + "/v1/duplex?autostart=0")
        raw.send_header(FIRST_MESSAGE_MAX_BYTES + 1)  # no session yet: refused from the header
        assert raw.close_code() == 1009
        raw.close()
        c = RawClient(url + "/v1/duplex?autostart=0")
        c.send({"type": "session.update", "session": {}})
        c.recv_type("session.updated")
        c.send(padded({"type": "bogus.event", "event_id": "big"}, 2 * FIRST_MESSAGE_MAX_BYTES))  # a session now
        assert c.recv_type("error")["error"]["code"] == "unknown_event"
        c.close()


# ---------------------------------------------------------------------------------------------------- typed requests


class HoldsTypedSpeech:
    """The simulator, holding its first position that carries sound until released: the client sends none, so that is
    the first position of a typed job's speech, and the job has touched the model (later requests wait behind it)."""

    def __init__(self) -> None:
        from vllm_omni_voicechat.sim.model import SimulatorModel

        self.inner = SimulatorModel()
        self.held = threading.Event()
        self.go = threading.Event()

    def prefill(self, prompt) -> None:
        self.inner.prefill(prompt)

    def step(self, position):
        if not self.go.is_set() and any(position.pcm):
            self.held.set()
            self.go.wait(30)
        return self.inner.step(position)

    def abort(self) -> None:
        self.go.set()
        self.inner.abort()


def test_typed_requests_in_flight_are_bounded_on_both_dialects():
    """One typed job active (it has touched the model) and eight waiting behind it: the next request is refused at
    once, v3 ``input_text.rejected{reason:"typed_input_unavailable"}``, tiered error ``typed_input_unavailable``; the
    waiting ones are not, and the session goes on."""
    from vllm_omni_voicechat.session.typed import MAX_QUEUED_TYPED_REQUESTS

    models: list[HoldsTypedSpeech] = []

    def factory() -> HoldsTypedSpeech:
        models.append(HoldsTypedSpeech())
        return models[-1]

    config = ServerConfig.simulator(max_sessions=2)
    config.model_factory = factory
    with running_app(config) as (url, app):
        def all_in_the_inbox() -> None:
            """The requests wait, undecided, in the session's inbox while the job's position is held; released, the
            session takes them in order before the job's next position."""
            wait_until(lambda: app.live.hosted()[0].shell.inbox_messages == MAX_QUEUED_TYPED_REQUESTS + 1)
            models[-1].go.set()

        try:
            v3 = RawClient(url + "/v1/realtime")
            assert v3.recv()["type"] == "session.created"
            v3.send(V3_UPDATE)
            v3.recv_type("session.updated")
            v3.send({"type": "input_text.request", "event_id": "t-a", "job_id": "a", "text": "Tell me a long story."})
            assert models[-1].held.wait(10)
            for k in range(MAX_QUEUED_TYPED_REQUESTS + 1):
                v3.send({"type": "input_text.request", "event_id": f"t-w{k}", "job_id": f"w{k}", "text": "Hi."})
            all_in_the_inbox()
            events = v3.recv_until(lambda e: e["type"] == "input_text.rejected")
            rejected = events[-1]
            assert (rejected["job_id"], rejected["reason"]) == (f"w{MAX_QUEUED_TYPED_REQUESTS}", "typed_input_unavailable")
            assert [e for e in events if e["type"] == "input_text.rejected"] == [rejected]
            v3.send({"type": "session.stop", "event_id": "stop"})
            assert v3.close_code() == 1000

            tiered = RawClient(url + "/v1/duplex")
            tiered.send({"type": "session.update", "session": {}})
            tiered.recv_type("session.updated")
            tiered.send({"type": "input.text.append", "text": "Tell me a long story."})
            assert models[-1].held.wait(10)
            for k in range(MAX_QUEUED_TYPED_REQUESTS + 1):
                tiered.send({"type": "input.text.append", "event_id": f"w{k}", "text": "Hi."})
            all_in_the_inbox()
            events = tiered.recv_until(lambda e: e["type"] == "error")
            assert events[-1]["error"]["code"] == "typed_input_unavailable", events[-1]
            tiered.send({"type": "session.close"})
            assert tiered.close_code() == 1000
        finally:
            for model in models:
                model.go.set()
