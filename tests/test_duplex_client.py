"""vLLM-Omni 0.30.0's own DuplexClient (unmodified) against the real server on the simulator.

Skipped where vllm-omni is not installed; CI runs it in the CPU vLLM-Omni venv.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.server import ServerConfig

from .compat import CuttableTransport, load_duplex_client_module
from .server_fixture import running_app

dc = load_duplex_client_module()

SILENCE_200MS = bytes(2 * 3200)
WEATHER = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def client(url: str, **kw) -> "dc.DuplexClient":
    kw.setdefault("reconnect", None)
    kw.setdefault("heartbeat_interval_s", None)
    return dc.DuplexClient(url, model="sim", **kw)


async def speak(c, text: str, *, chunk_ms: int = 80) -> None:
    await c.stream_pcm(render_speech(text) + SILENCE_200MS, chunk_ms=chunk_ms, realtime=False)
    await c.commit()


async def first_response(c):
    async for handle in c.responses():
        if handle.decision == "listen" and handle.response_id is None:
            continue
        return handle
    raise AssertionError("no response")


async def collect_audio(handle) -> bytes:
    return b"".join([chunk async for chunk in handle.audio()])


@pytest.fixture(scope="module")
def server():
    with running_app(ServerConfig.simulator(max_sessions=4, disconnect_grace_s=5.0)) as (url, app):
        yield url, app


@pytest.mark.parametrize("chunk_ms", [80, 200])
def test_basic_turn_stream_commit_responses(server, chunk_ms):
    url, _ = server

    async def main():
        async with client(url) as c:
            await speak(c, "hello", chunk_ms=chunk_ms)
            handle = await first_response(c)
            pcm = await collect_audio(handle)
            await handle.wait(10)
            assert handle.done_event.type == "response.done"
            assert handle.done_event.raw["response"]["status"] == "completed"
            return pcm, handle.transcript

    pcm, transcript = run(main())
    assert transcript == "You said: hello."
    assert decode_speech(pcm, 24_000) == "You said: hello."


def test_nemotron_preset_f32_in_22k_out(server):
    url, _ = server
    config = dc.SessionConfig(input_audio=dc.AudioFormat("pcm_f32le", 16_000),
                              output_audio=dc.AudioFormat("pcm16", 22_050), extra_body={"realtime_tools": []})

    async def main():
        async with client(url, config=config) as c:
            pcm16 = np.frombuffer(render_speech("hi there") + SILENCE_200MS, dtype="<i2")
            f32 = (pcm16.astype("<f4") / 32768.0).tobytes()
            await c.stream_pcm(f32, chunk_ms=80, realtime=False)
            await c.commit()
            handle = await first_response(c)
            return await collect_audio(handle)

    assert decode_speech(run(main()), 22_050) == "You said: hi there."


def test_ack_playback_is_acknowledged(server):
    url, _ = server

    async def main():
        async with client(url) as c:
            await speak(c, "hello")
            handle = await first_response(c)
            await collect_audio(handle)
            await c.ack_playback(played_ms=int(handle.played_ms), response_id=handle.response_id)
            ack = await c.wait_for("playback.acknowledged", timeout_s=10)
            return handle, ack.raw["event"]

    handle, event = run(main())
    assert event["response_id"] == handle.response_id and event["item_id"] == f"item_{handle.response_id}"
    assert event["played_ms"] == event["playback"]["sent_ms"] > 0


def test_cancel_response_then_next_turn_in_a_new_epoch(server):
    url, _ = server

    async def main():
        async with client(url) as c:
            await speak(c, "please tell me a very long story about the sea and the sky")
            handle = await first_response(c)
            await c.wait_for("response.output_audio.delta", timeout_s=10)
            await c.cancel_response(handle.response_id)
            await handle.wait(10)
            first = handle.done_event.raw
            await speak(c, "again")
            nxt = await first_response(c)
            pcm = await collect_audio(nxt)
            return first, nxt, pcm

    first, nxt, pcm = run(main())
    assert first["response"]["status"] == "cancelled"
    assert nxt.response_id != first["response_id"]
    assert nxt.done_event.raw["response"]["metadata"]["epoch"] == first["response"]["metadata"]["epoch"] + 1
    assert decode_speech(pcm, 24_000) == "You said: again."


def test_tool_call_round_trip_via_send(server):
    url, _ = server
    config = dc.SessionConfig(instructions="Use tools.", extra_body={"realtime_tools": WEATHER})

    async def main():
        async with client(url, config=config) as c:
            await speak(c, 'call get_weather {"city": "Paris"}')
            done = await c.wait_for("response.function_call_arguments.done", timeout_s=20)
            await c.send({"type": "conversation.item.create",
                          "item": {"type": "function_call_output", "call_id": done.raw["call_id"],
                                   "output": '{"temp_c": 21}'}})
            await c.send({"type": "response.create"})
            pcm = b""
            async for handle in c.responses():
                chunk = await collect_audio(handle)
                pcm += chunk
                if handle.transcript.startswith("The result"):
                    return done.raw, handle.transcript, pcm
            raise AssertionError("no post-tool response")

    done, transcript, pcm = run(main())
    assert done["name"] == "get_weather" and '"city":"Paris"' in done["arguments"]
    assert "21" in transcript


def test_automatic_resume_after_the_transport_dies_mid_response(server):
    url, _ = server
    transports: list[CuttableTransport] = []

    async def connect(u):
        import websockets

        t = CuttableTransport(await websockets.connect(u, max_size=64 << 20))
        transports.append(t)
        return t

    async def main():
        c = dc.DuplexClient(url, model="sim", reconnect=dc.ReconnectPolicy(5, (0.05, 0.2)),
                            heartbeat_interval_s=None, connect=connect)
        collector = dc.EventCollector()
        async with c:
            consumer = asyncio.create_task(collector.consume(c))
            token0 = c.resume_token
            await speak(c, "please tell me a very long story about the sea and the sky")
            handle = await first_response(c)
            await c.wait_for("response.output_audio.delta", timeout_s=10)
            transports[0].cut()
            pcm = await collect_audio(handle)
            await handle.wait(20)
            resumed = c.resume_token
            consumer.cancel()
            return collector, handle, pcm, token0, resumed

    collector, handle, pcm, token0, resumed = run(main())
    assert len(transports) == 2 and resumed != token0
    assert collector.count("connection.resumed") == 1
    seqs = [e["server_event_seq"] for e in collector.events if isinstance(e.get("server_event_seq"), int)]
    assert seqs == sorted(set(seqs)) and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert handle.done_event.raw["response"]["status"] == "completed"
    assert handle.transcript == "You said: please tell me a very long story about the sea and the sky."
