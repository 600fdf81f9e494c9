"""Fuzzing over a real WebSocket: the transport parsing path (docs/reliability.md, "Fuzzing").

A few hundred generated frames (valid, invalid and hostile: bad JSON, deep nesting, binary frames, huge
payloads, bad base64, wrong types, escaped lone surrogates) per dialect go to the uvicorn fixture server; the
server-side trace tap checks every socket (the fixture fails the test on any invariant violation). Afterwards the
same session must still serve a valid turn, and the tiered session must survive a drop and a resume.
"""

from __future__ import annotations

import base64
import json
import random

import pytest

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.server import ServerConfig

from .fuzz import FuzzStats, TieredEpisode, V3Episode
from .server_fixture import RawClient, running_app

FRAMES = 200
SILENCE = base64.b64encode(bytes(16 * 2560)).decode()  # 16 silent frames (1.28 s), the largest v3 append


def b64(pcm: bytes) -> str:
    return base64.b64encode(pcm).decode()


def v3_frames(seed: int) -> list:
    """Frames from the in-process generator, minus the barrier violations (fatal by contract)."""
    rng = random.Random(seed)
    gen = V3Episode(rng, FuzzStats("v3", seed), "ws")
    out = []
    while len(out) < FRAMES:
        r = rng.random()
        if r < 0.3:
            out.append(gen.append_event(gen.pcm_chunk()))
        elif r < 0.55:
            out.append(gen.bad_append())
        elif r < 0.7:
            base = rng.choice([gen.append_event(b"\x00\x00" * 320), {"type": "session.stop", "event_id": "m"},
                               {"type": "conversation.item.create", "event_id": "m", "item": {}}])
            frame = gen.mutate(base)
            if frame.get("type") in ("session.stop", "input_audio_buffer.turn_start", "input_audio_buffer.commit"):
                continue
            out.append(frame)
        else:
            out.append(gen.hostile_frame())
    return out


def send(c: RawClient, frame) -> None:
    c.ws.send(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))


def drain_until(c: RawClient, predicate) -> list[dict]:
    return c.recv_until(predicate, skip_metrics=True)


@pytest.fixture(scope="module")
def server():
    with running_app(ServerConfig.simulator(settlement_blank_frames=3, max_sessions=4, disconnect_grace_s=30.0)) as (
            url, app_server):
        yield url, app_server


@pytest.mark.parametrize("seed", [1, 2])
def test_v3_socket_survives_generated_frames_then_serves_a_turn(server, seed):
    url, _ = server
    c = RawClient(url + "/v1/voicechat", timeout=20)
    assert c.recv()["type"] == "session.created"
    send(c, {"type": "session.update", "event_id": "u", "session": {"protocol_version": 3}})
    drain_until(c, lambda e: e["type"] == "session.updated")
    for frame in v3_frames(seed):
        send(c, frame)
    send(c, {"type": "probe.end", "event_id": "probe-end"})  # answered after every earlier frame
    events = drain_until(c, lambda e: e["type"] == "error" and e["error"].get("client_event_id") == "probe-end")
    assert not any(e["type"] == "error" and e["error"]["fatal"] for e in events)
    # still usable: a valid turn gets its response
    send(c, {"type": "input_audio_buffer.turn_start", "event_id": "ts", "client_turn_id": 500})
    pcm = render_speech("hello there") + bytes(2560 * 2)
    for i in range(0, len(pcm), 2560):
        send(c, {"type": "input_audio_buffer.append", "event_id": f"a{i}", "encoding": "pcm16", "sample_rate": 16000,
                 "channels": 1, "audio": b64(pcm[i:i + 2560])})
    send(c, {"type": "input_audio_buffer.commit", "event_id": "tc", "client_turn_id": 500})
    for i in range(40):  # a live microphone keeps streaming (silence): positions run at input speed, not paced
        send(c, {"type": "input_audio_buffer.append", "event_id": f"s{i}", "encoding": "pcm16", "sample_rate": 16000,
                 "channels": 1, "audio": SILENCE})
    events = drain_until(c, lambda e: e["type"] == "response.done")
    turn = next(e["turn_id"] for e in events if e["type"] == "input_audio_buffer.committed")
    assert [e["turn_id"] for e in events if e["type"] == "response.created"][-1] == turn
    send(c, {"type": "session.stop", "event_id": "stop"})
    drain_until(c, lambda e: e["type"] == "session.closed")
    assert c.close_code() == 1000


def test_v3_deep_nesting_is_a_recoverable_error_not_a_dropped_session(server):
    """Regression: 100,000 nested brackets raised RecursionError out of V3Session.receive (the session died
    silently); now they are refused undecoded (more containers than the limit), and nesting within the limit but
    deeper than the decoder goes is the recoverable invalid_json."""
    url, _ = server
    c = RawClient(url + "/v1/voicechat", timeout=20)
    assert c.recv()["type"] == "session.created"
    send(c, "[" * 100_000 + "]" * 100_000)
    err = c.recv()
    assert err["type"] == "error" and err["error"]["code"] == "event_too_large" and err["error"]["fatal"] is False
    send(c, "[" * 10_000 + "]" * 10_000)
    err = c.recv()
    assert err["type"] == "error" and err["error"]["code"] == "invalid_json" and err["error"]["fatal"] is False
    send(c, '{"type": "\\ud800", "event_id": "\\udfff"}')  # echoes a lone surrogate: still valid UTF-8 out
    err = c.recv()
    assert err["error"]["code"] == "unsupported_event" and err["error"]["client_event_id"] == "\udfff"
    c.close()


def tiered_frames(seed: int) -> list:
    rng = random.Random(seed)
    gen = TieredEpisode(rng, FuzzStats("tiered", seed), "ws")
    gen.responses, gen.items, gen.published, gen.answered, gen.client_last = [], [], [], set(), 0
    out = []
    while len(out) < FRAMES:
        r = rng.random()
        if r < 0.3:
            out.append(gen.append_event(gen.pcm_chunk()))
        elif r < 0.5:
            out.append(gen.valid_other())
        elif r < 0.65:
            out.append(gen.bad_append())
        elif r < 0.8:
            out.append(gen.mutate(gen.valid_other()))
        else:
            out.append(gen.hostile_frame())
    return [f for f in out if not (isinstance(f, dict) and f.get("type") in ("session.close", "close"))]


@pytest.mark.parametrize("seed", [1, 2])
def test_tiered_socket_survives_generated_frames_a_drop_and_a_resume(server, seed):
    url, _ = server
    c = RawClient(url + "/v1/duplex", timeout=20)
    send(c, {"type": "session.update", "event_id": "u", "session": {"instructions": "Be brief."}})
    created = c.recv()
    assert created["type"] == "session.created"
    drain_until(c, lambda e: e["type"] == "session.updated")
    frames = tiered_frames(seed)
    half = len(frames) // 2
    for frame in frames[:half]:
        send(c, frame)
    send(c, {"type": "probe.end", "event_id": "probe-1"})
    events = drain_until(c, lambda e: e["type"] == "error" and e["error"].get("event_id") == "probe-1")
    seqs = [e["server_event_seq"] for e in c.received if "server_event_seq" in e]
    c.ws.close_socket()  # a drop (no close handshake): the session waits for a resume
    r = RawClient(url + "/v1/duplex?autostart=0", timeout=20)
    send(r, {"type": "session.resume", "session_id": created["session"]["id"], "resume_token": created["resume_token"],
             "last_received_server_event_seq": seqs[-1]})
    resumed = r.recv()
    assert resumed["type"] == "session.resumed", resumed
    for frame in frames[half:]:
        send(r, frame)
    send(r, {"type": "probe.end", "event_id": "probe-2"})
    drain_until(r, lambda e: e["type"] == "error" and e["error"].get("event_id") == "probe-2")
    # still usable: speech + commit gets a response
    pcm = render_speech("hello there") + bytes(2560 * 2)
    for i in range(0, len(pcm), 2560):
        send(r, {"type": "input_audio_buffer.append", "audio": b64(pcm[i:i + 2560]), "format": "pcm16",
                 "sample_rate_hz": 16000})
    send(r, {"type": "input_audio_buffer.commit", "event_id": "vc"})
    send(r, {"type": "response.create", "event_id": "vr"})  # in case a fuzzed update set auto_response:false
    for _ in range(40):  # a live microphone keeps streaming (silence): positions run at input speed, not paced
        send(r, {"type": "input_audio_buffer.append", "audio": SILENCE, "format": "pcm16", "sample_rate_hz": 16000})
    # (a response a fuzzed frame opened, e.g. typed text, may still end first: wait for one created from here on)
    created: set[str] = set()

    def our_response_done(e: dict) -> bool:
        if e["type"] == "response.created":
            created.add(e["response"]["id"])
        return e["type"] == "response.done" and e["response"]["id"] in created

    events = drain_until(r, our_response_done)
    assert created
    send(r, {"type": "session.close", "event_id": "bye"})
    drain_until(r, lambda e: e["type"] == "session.closed")
    assert r.close_code() == 1000
    assert events  # the server-side trace tap checks both sockets at fixture exit
