"""The position guard on the real engine on CPU: a session that reaches ``voicechat.max_session_model_frames``
ends with the fatal ``session_position_limit``, ``session.closed{failed}`` and close 1000, and frees its slot.

A server of its own, from deploy/voicechat-cpu.yaml with a guard of ``LIMIT`` positions (everything else as
deployed): the deployed guard of 1,000 took a burst-fed session about 100 s on 2 cores, long enough to meet this
VM's multi-second scheduling stalls (uvicorn's keepalive, which such a stall once tripped, is now off: omni/mount.py).
That a session as long as the deployed guard fits Stage 1 is the start-up check's job (tests/test_omni_settings.py;
measured: docs/engine-on-cpu.md); the first GPU run drives ``session_to_the_guard`` to the deployed guard
(docs/running-on-gpu.md). Runs in the engine venv; skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid

import pytest

from vllm_omni_voicechat.omni.local_server import CPU_DEPLOY, engine_available, engine_server, get_json

_skip = engine_available()
pytestmark = [pytest.mark.engine, pytest.mark.skipif(_skip is not None, reason=_skip or "")]

LIMIT = 120
FRAME_BYTES = 2 * 1280  # 80 ms of 16 kHz PCM16


def guarded_deploy(path, limit: int):
    import yaml

    deploy = yaml.safe_load(CPU_DEPLOY.read_text())
    assert deploy["voicechat"]["max_session_model_frames"] > limit  # the YAML really is changed
    deploy["voicechat"]["max_session_model_frames"] = limit
    path.write_text(yaml.safe_dump(deploy, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from vllm_omni_voicechat.omni.tiny import make_tiny_checkpoint

    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-checkpoint"), seed=0)
    logs = tmp_path_factory.mktemp("engine-guard")
    with engine_server(checkpoint, logs, deploy=guarded_deploy(logs / "voicechat-guard.yaml", LIMIT)) as srv:
        yield srv


def event(kind: str, **fields) -> str:
    return json.dumps({"type": kind, "event_id": f"evt_{uuid.uuid4().hex}", **fields})


def frames(events: list[dict]) -> list[int]:
    return [e["frame"] for e in events if e["type"] == "voicechat.metrics" and e["frame"] is not None]


async def session_to_the_guard(ws_base: str, limit: int) -> tuple[list[dict], Exception]:
    """On the raw wire (V3Client disconnects at the first fatal error): one turn fed past the guard in small
    bursts, then everything the server sends until it closes."""
    import websockets

    from vllm_omni_voicechat.audio.speech import render_speech

    events: list[dict] = []
    async with websockets.connect(ws_base + "/v1/voicechat", ping_interval=None, max_size=None) as ws:
        try:
            async def until(check, timeout: float = 60.0) -> None:
                async with asyncio.timeout(timeout):
                    while not check():
                        events.append(json.loads(await ws.recv()))

            def failed() -> bool:
                return any(e["type"] == "error" for e in events)

            await until(lambda: events)
            await ws.send(event("session.update", session={"protocol_version": 3, "instructions": "Hi.", "tools": []}))
            await until(lambda: events[-1]["type"] == "session.updated")
            await ws.send(event("input_audio_buffer.turn_start", client_turn_id=1))
            audio = render_speech("x") + bytes(FRAME_BYTES * (limit + 20))
            sent = 0
            while sent * FRAME_BYTES < len(audio) and not failed():
                for _ in range(16):  # small bursts: well inside the receive pump (256) and uvicorn's queue (32)
                    chunk = audio[sent * FRAME_BYTES:(sent + 1) * FRAME_BYTES]
                    if not chunk:
                        break
                    await ws.send(event("input_audio_buffer.append", encoding="pcm16", sample_rate=16000,
                                        channels=1, audio=base64.b64encode(chunk).decode()))
                    sent += 1
                await until(lambda: len(frames(events)) >= min(sent, limit) - 8 or failed())
            await until(lambda: False, timeout=60)
        except websockets.ConnectionClosed as closed:
            # The guard can end the session while a burst is being sent (the send raises first): what the server sent
            # before its close is still queued on our side, and recv() hands it out before raising again.
            with contextlib.suppress(websockets.ConnectionClosed):
                while True:
                    events.append(json.loads(await ws.recv()))
            return events, closed
    raise AssertionError("the server never closed the session")


def test_a_session_reaching_its_position_guard_ends_cleanly_and_frees_its_slot(server):
    events, closed = asyncio.run(asyncio.wait_for(session_to_the_guard(server.ws, LIMIT), 120))
    close_code = closed.rcvd.code if closed.rcvd else None
    assert close_code == 1000, (f"{closed} after {len(frames(events))} positions; the server's log ends:\n"
                                + server.log_tail(40))
    errors = [e for e in events if e["type"] == "error"]
    assert [e["error"]["code"] for e in errors] == ["session_position_limit"] and errors[0]["error"]["fatal"] is True
    assert events[-1]["type"] == "session.closed" and events[-1]["status"] == "failed"
    assert frames(events) == list(range(LIMIT))  # every position up to the guard ran once, in order; none beyond it
    assert get_json(server.http + "/health")[1]["active_sessions"] == 0
