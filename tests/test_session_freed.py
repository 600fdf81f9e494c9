"""An ended session is freed by reference counting: with the cycle collector off, nothing of a session (its core,
wire session, shell, attachment, outbox, model, its socket's protocol and websockets' protocol inside it) outlives
its handler, and nothing of a refused connection outlives it either. Real server, real WebSockets; each scenario
waits for the objects to die (an awaited condition: a cycle would keep them alive for good)."""

from __future__ import annotations

import base64
import contextlib
import gc
import time
import weakref
from collections.abc import Iterator

import pytest

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.server import uvicorn as server_uvicorn
from vllm_omni_voicechat.wire.limits import V3_MAX_MESSAGE_BYTES

from .server_fixture import RawClient, SocketClient, running_app

SILENCE = bytes(12 * INPUT_FRAME_BYTES)
LONG = "please tell me a very long story about the sea and the sky"
V3_UPDATE = {"type": "session.update", "event_id": "u1",
             "session": {"protocol_version": 3, "instructions": "Be brief."}}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def session_parts(app, timeout: float = 10.0) -> dict[str, weakref.ref]:
    """Weak references to the one live session's objects, once it is hosted."""
    deadline = time.monotonic() + timeout
    while not app.live:
        assert time.monotonic() < deadline, "no session was hosted"
        time.sleep(0.01)  # ok: polling for the session to be hosted (an awaited condition)
    (session_id,) = app.live
    att = app.live[session_id].attachment
    shell = att.shell
    parts = {"attachment": att, "shell": shell, "wire session": shell.core, "core": shell.core.core,
             "model": shell.model, "outbox": att.outbox}
    return {name: weakref.ref(obj) for name, obj in parts.items() if obj is not None} | socket_parts()


def socket_parts() -> dict[str, weakref.ref]:
    """Weak references to every open socket's protocol and the websockets protocol it drives."""
    refs = {}
    for k, protocol in enumerate(list(server_uvicorn._PROTOCOLS.values())):
        refs[f"socket {k}"] = weakref.ref(protocol)
        refs[f"websockets protocol {k}"] = weakref.ref(protocol.conn)
    return refs


def wait_freed(refs: dict[str, weakref.ref], timeout: float = 10.0) -> None:
    """Until every referent is gone (the handler has returned and dropped its references)."""
    deadline = time.monotonic() + timeout
    while alive := [name for name, ref in refs.items() if ref() is not None]:
        if time.monotonic() > deadline:
            pytest.fail(f"still alive with the collector off: {alive}")
        time.sleep(0.01)  # ok: polling for the handler's return (an awaited condition)


def v3_append(pcm: bytes, event_id: str) -> dict:
    return {"type": "input_audio_buffer.append", "event_id": event_id, "encoding": "pcm16", "sample_rate": 16000,
            "channels": 1, "audio": base64.b64encode(pcm).decode()}


def v3_turn(c: RawClient, text: str, k: int) -> None:
    c.send({"type": "input_audio_buffer.turn_start", "event_id": f"s{k}", "client_turn_id": k})
    c.send(v3_append(render_speech(text), f"a{k}"))
    c.send({"type": "input_audio_buffer.commit", "event_id": f"c{k}", "client_turn_id": k})


def open_v3(url: str) -> RawClient:
    c = RawClient(url + "/v1/voicechat")
    c.recv_type("session.created")
    c.send(V3_UPDATE)
    c.recv_type("session.updated")
    return c


def test_v3_session_stopped_after_a_turn_is_freed():
    with running_app(ServerConfig()) as (url, app), collector_off():
        c = open_v3(url)
        refs = session_parts(app)
        v3_turn(c, "hello", 1)
        c.recv_type("response.done")
        c.send({"type": "session.stop", "event_id": "x"})
        assert c.close_code() == 1000
        wait_freed(refs)


def test_a_refused_connection_is_freed(monkeypatch):
    """A connection refused for want of a slot (``server_busy``, close 1013): its socket's objects die with it."""
    made: dict[str, weakref.ref] = {}
    connection_made = server_uvicorn.AbortableWebSockets.connection_made

    def recording(protocol, transport):
        connection_made(protocol, transport)
        k = len(made) // 2
        made[f"socket {k}"], made[f"websockets protocol {k}"] = weakref.ref(protocol), weakref.ref(protocol.conn)

    monkeypatch.setattr(server_uvicorn.AbortableWebSockets, "connection_made", recording)
    with running_app(ServerConfig(max_sessions=1, admission_queue=0)) as (url, app), collector_off():
        holder = open_v3(url)
        refs = session_parts(app)
        refused = RawClient(url + "/v1/voicechat")
        assert refused.recv()["error"]["code"] == "server_busy"
        assert refused.close_code() == 1013
        assert len(made) == 4
        wait_freed({"socket 1": made["socket 1"], "websockets protocol 1": made["websockets protocol 1"]})
        holder.close()
        wait_freed(refs)


def test_v3_session_whose_frame_websockets_refused_is_freed():
    """A frame over the size limit fails websockets' parser (close 1009): the error it keeps is let go too."""
    with running_app(ServerConfig()) as (url, app), collector_off():
        raw = SocketClient(url + "/v1/voicechat")
        raw.recv_frame()
        refs = session_parts(app)
        raw.send_header(V3_MAX_MESSAGE_BYTES + 1)
        assert raw.close_code() == 1009
        raw.close()
        wait_freed(refs)


def test_v3_session_dropped_mid_response_is_freed():
    with running_app(ServerConfig()) as (url, app), collector_off():
        c = open_v3(url)
        refs = session_parts(app)
        v3_turn(c, LONG, 1)
        c.recv_type("response.output_audio.delta")
        c.close()
        wait_freed(refs)


def test_v3_session_ended_by_a_fatal_error_is_freed():
    with running_app(ServerConfig()) as (url, app), collector_off():
        c = RawClient(url + "/v1/voicechat")
        c.recv_type("session.created")
        refs = session_parts(app)
        c.send({"type": "session.update", "event_id": "u1", "session": {"protocol_version": 2}})
        assert c.close_code() is not None
        assert [e["error"]["code"] for e in c.received if e["type"] == "error"] == ["unsupported_protocol_version"]
        wait_freed(refs)


def test_tiered_session_dropped_resumed_and_closed_is_freed():
    with running_app(ServerConfig(disconnect_grace_s=10.0)) as (url, app), collector_off():
        a = RawClient(url + "/v1/duplex")
        a.send({"type": "session.update", "session": {"instructions": "Be brief."}})
        created = a.recv_type("session.created")
        a.recv_type("session.updated")
        refs = session_parts(app)
        audio = base64.b64encode(render_speech("hello") + SILENCE).decode()
        a.send({"type": "input_audio_buffer.append", "audio": audio})
        a.recv_type("response.done")
        a.close()
        b = RawClient(url + "/v1/duplex?autostart=0")
        b.send({"type": "session.resume", "session_id": created["session"]["id"],
                "resume_token": created["resume_token"], "last_received_server_event_seq": 1})
        assert b.recv()["type"] == "session.resumed"
        b.send({"type": "session.close"})
        b.recv_type("session.closed")
        assert b.close_code() == 1000
        wait_freed(refs)


def test_tiered_session_with_a_function_call_is_freed():
    with running_app(ServerConfig()) as (url, app), collector_off():
        c = RawClient(url + "/v1/duplex")
        c.send({"type": "session.update", "session": {"instructions": "Be brief.", "tools": [WEATHER]}})
        c.recv_type("session.created")
        c.recv_type("session.updated")
        refs = session_parts(app)
        speech = render_speech('call get_weather {"city": "Paris"}') + SILENCE
        c.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(speech).decode()})
        call = c.recv_type("response.function_call_arguments.done")
        c.send({"type": "conversation.item.create",
                "item": {"type": "function_call_output", "call_id": call["call_id"], "output": '{"temp_c": 21}'}})
        c.send({"type": "response.create"})
        c.recv_type("response.done")
        c.send({"type": "session.close"})
        c.recv_type("session.closed")
        assert c.close_code() == 1000
        wait_freed(refs)
