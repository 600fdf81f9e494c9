"""Our ``DuplexClient`` session preset (``vllm_omni_voicechat.omni.client_preset``): the exact session payload,
its relation to vLLM-Omni 0.30's own Nemotron preset, and real sessions on the simulator server.

Needs vLLM-Omni (CI runs it in the CPU vLLM-Omni venv); skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.server import ServerConfig

from .compat import load_duplex_client_module
from .server_fixture import running_server

dc = load_duplex_client_module()  # skips without vllm-omni; stubs its heavy __init__ where vllm is absent
pytest.importorskip("vllm_omni", reason="vllm-omni is not installed")
preset = pytest.importorskip("vllm_omni_voicechat.omni.client_preset")

WEATHER_GA = {"type": "function", "name": "get_weather", "description": "Weather for a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
WEATHER_WRAPPED = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_the_default_payload():
    config = preset.create_duplex_session_config()
    assert config.to_session_payload(model="sim") == {
        "model": "sim",
        "modalities": ["audio", "text"],
        "input_audio_format": "pcm16",
        "output_audio_format": "pcm16",
        "sample_rate_hz": 16_000,
        "audio": {"input": {"sample_rate_hz": 16_000}, "output": {"sample_rate_hz": 22_050}},
        "turn_detection": None,
        "extra_body": {"auto_response": True},
    }
    assert preset.append_bytes(config) == 2_560  # 80 ms of 16 kHz PCM16
    assert (preset.APPEND_MS, preset.MODEL, preset.SIMULATOR_MODEL) == (
        80, "nvidia/NVIDIA-NemotronLabs-VoiceChat-11B", "sim")


def test_every_option_lands_where_the_server_reads_it():
    config = preset.create_duplex_session_config(
        instructions="Be brief.", tools=[WEATHER_GA, WEATHER_WRAPPED], output_sample_rate_hz=24_000,
        input_encoding="pcm_f32le", turn_detection={"type": "server_vad"}, idle_timeout_s=30.0,
        extra_body={"return_stage_metrics": True}, voice="default", temperature=0.0,
    )
    payload = config.to_session_payload(model="m")
    assert payload == {
        "model": "m",
        "modalities": ["audio", "text"],
        "input_audio_format": "pcm_f32le",
        "output_audio_format": "pcm16",
        "sample_rate_hz": 16_000,
        "audio": {"input": {"sample_rate_hz": 16_000}, "output": {"sample_rate_hz": 24_000}},
        "turn_detection": {"type": "server_vad"},
        "instructions": "Be brief.",
        "voice": "default",
        "temperature": 0.0,
        "idle_timeout_s": 30.0,
        "extra_body": {"auto_response": True, "return_stage_metrics": True,
                       "realtime_tools": [WEATHER_GA, WEATHER_WRAPPED]},
    }
    assert preset.append_bytes(config) == 5_120  # 80 ms of 16 kHz float32


def test_with_float32_input_it_is_vllm_omnis_own_nemotron_preset():
    from vllm_omni.clients.nemotron_voicechat import create_duplex_session_config as upstream

    kw = {"instructions": "Hi.", "tools": [WEATHER_GA], "idle_timeout_s": 5.0, "extra_body": {"x": 1}}
    assert preset.create_duplex_session_config(input_encoding="pcm_f32le", **kw) == upstream(**kw)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"input_encoding": "g711_ulaw"}, "input_encoding must be one of"),
        ({"output_sample_rate_hz": 0}, "output_sample_rate_hz must be a positive integer"),
        ({"output_sample_rate_hz": 22_050.0}, "output_sample_rate_hz must be a positive integer"),
        ({"tools": [{"type": "function"}]}, "every tool needs a function name"),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "every tool needs a function name"),
        ({"tools": ["get_weather"]}, "every tool needs a function name"),
    ],
)
def test_bad_options_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        preset.create_duplex_session_config(**kwargs)


def test_stream_pcm16_refuses_what_it_cannot_send():
    client = dc.DuplexClient("ws://unused", model="sim", config=preset.create_duplex_session_config())
    with pytest.raises(ValueError, match="even byte count"):
        asyncio.run(preset.stream_pcm16(client, b"\x00"))
    client24 = dc.DuplexClient("ws://unused", model="sim", config=preset.create_duplex_session_config(
        input_audio=dc.AudioFormat("pcm16", 24_000)))
    with pytest.raises(ValueError, match="input rate is 24000 Hz"):
        asyncio.run(preset.stream_pcm16(client24, b"\x00\x00"))


# ----------------------------------------------------------------------------------------------- real sessions


@pytest.fixture(scope="module")
def server():
    with running_server(ServerConfig.simulator(max_sessions=4)) as url:
        yield url


class _Recording:
    """A transport that records what the client writes."""

    def __init__(self, ws, sent: list[dict]):
        self.ws, self.sent = ws, sent

    async def send(self, data):
        self.sent.append(json.loads(data))
        await self.ws.send(data)

    async def recv(self):
        return await self.ws.recv()

    async def close(self):
        await self.ws.close()


def recording_client(url: str, config, sent: list[dict]):
    async def connect(u):
        import websockets

        return _Recording(await websockets.connect(u, max_size=64 << 20), sent)

    return dc.DuplexClient(url, model=preset.SIMULATOR_MODEL, config=config, reconnect=None,
                           heartbeat_interval_s=None, connect=connect)


async def first_spoken(client):
    async for handle in client.responses():
        if handle.response_id is not None:
            return handle, b"".join([chunk async for chunk in handle.audio()])
    raise AssertionError("no response")


@pytest.mark.parametrize("encoding", ["pcm16", "pcm_f32le"])
def test_a_turn_streams_80ms_appends_and_answers_at_the_native_rate(server, encoding):
    config = preset.create_duplex_session_config(input_encoding=encoding)
    sent: list[dict] = []
    speech = render_speech("hello preset")

    async def main():
        async with recording_client(server, config, sent) as client:
            await preset.stream_pcm16(client, speech, realtime=False)
            await client.commit()
            handle, pcm = await first_spoken(client)
            await handle.wait(20)
            return client.session_info, handle, pcm

    session, handle, pcm = asyncio.run(asyncio.wait_for(main(), 60))
    appends = [e for e in sent if e["type"] == "input_audio_buffer.append"]
    frames = -(-len(speech) // 2_560)
    assert len(appends) == frames
    assert {(e["format"], e["sample_rate_hz"]) for e in appends} == {(encoding, 16_000)}
    assert [e["duration_ms"] for e in appends[:-1]] == [80] * (frames - 1)
    assert appends[-1]["audio_end_ms"] == round(len(speech) / 32)
    assert session["output_audio_format"] == "pcm16"
    assert handle.done_event.raw["response"]["status"] == "completed"
    assert handle.transcript == "You said: hello preset."
    assert decode_speech(pcm, 22_050) == "You said: hello preset."


def test_preset_tools_reach_the_model(server):
    config = preset.create_duplex_session_config(tools=[WEATHER_GA])

    async def main():
        async with recording_client(server, config, []) as client:
            await preset.stream_pcm16(client, render_speech('call get_weather {"city": "Oslo"}'), realtime=False)
            await client.commit()
            return (await client.wait_for("response.function_call_arguments.done", timeout_s=20)).raw

    done = asyncio.run(asyncio.wait_for(main(), 60))
    assert (done["name"], json.loads(done["arguments"])) == ("get_weather", {"city": "Oslo"})


# ---------------------------------------------------------------------------------------------------- resuming


class ScriptedTransport:
    """A transport the test scripts (DuplexClient's ``connect=`` seam): what the client sent, server events fed
    by the test, a drop, and a close the test can hold open."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.inbound: asyncio.Queue = asyncio.Queue()
        self.dead = False
        self.closing = asyncio.Event()
        self.closing.set()

    async def send(self, data: str) -> None:
        if self.dead:
            raise ConnectionError("transport dropped")
        self.sent.append(json.loads(data))

    async def recv(self) -> str:
        item = await self.inbound.get()
        if isinstance(item, BaseException):
            raise item
        return json.dumps(item)

    async def close(self) -> None:
        await self.closing.wait()

    def drop(self) -> None:
        self.dead = True
        self.inbound.put_nowait(ConnectionError("transport dropped"))


def appended(transport: ScriptedTransport) -> list[str]:
    return [e["event_id"] for e in transport.sent if e["type"] == "input_audio_buffer.append"]


async def until(predicate, what: str) -> None:
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0)  # ok: yields to the client's tasks, no wall-clock wait
    raise AssertionError(f"never: {what}")


async def resuming_session(receipt_for) -> tuple[list[ScriptedTransport], list[str], Any]:
    """A ResumingDuplexClient that appends a0, a1 on its first transport, loses it while appending a2, resumes on
    a second whose ``session.resumed`` carries ``receipt_for(ids)``, and appends a3 while the first transport's
    close is still pending (the application's next event must not overtake what is resent)."""
    transports = [ScriptedTransport(), ScriptedTransport()]
    pending = iter(transports)
    urls: list[str] = []

    async def connect(url: str) -> ScriptedTransport:
        urls.append(url)
        return next(pending)

    first, second = transports
    first.inbound.put_nowait({"type": "session.created", "session": {"id": "S"}, "resume_token": "rt_1",
                              "attachment_generation": 1})
    client = preset.ResumingDuplexClient("ws://x/v1/duplex", model="sim", connect=connect,
                                         heartbeat_interval_s=None,
                                         reconnect=dc.ReconnectPolicy(max_attempts=1, backoff_s=(0.0, 0.0)))
    await client.__aenter__()
    await client.append_audio(bytes(2560))
    await client.append_audio(bytes(1000))
    first.closing.clear()  # the client's close of the dead transport will hang until released
    first.drop()
    await client.append_audio(bytes(640))  # written into the dead transport: no error, journaled
    ids = [*appended(first), None]
    ids[2] = client.input_journal._entries[-1].event_id
    await until(lambda: second.sent, "session.resume on the second transport")
    assert second.sent[0]["type"] == "session.resume" and second.sent[0]["resume_token"] == "rt_1"
    # The routing key a balancer reads at the upgrade: always persist=session_id, the id once there is one
    assert urls == ["ws://x/v1/duplex?duplex=1&model=sim&autostart=0&persist=session_id",
                    "ws://x/v1/duplex?duplex=1&model=sim&autostart=0&persist=session_id&session_id=S"]
    second.inbound.put_nowait({"type": "session.resumed", "session_id": "S", "session": {"id": "S"},
                               "attachment_generation": 2, "resume_token": "rt_2", **receipt_for(ids)})
    await until(lambda: client._ws is second, "the switch to the second transport")
    a3 = asyncio.ensure_future(client.append_audio(bytes(320)))
    for _ in range(50):
        await asyncio.sleep(0)  # ok: a3 runs as far as it can (without the hold-back it would go out now)
    first.closing.set()
    await a3
    ids.append(appended(second)[-1])
    return transports, ids, client


def test_resuming_client_resends_exactly_what_the_receipt_lacks_before_anything_new():
    async def run():
        (first, second), ids, client = await resuming_session(lambda ids: {"input_received": {
            "audio_bytes": 2560, "appends": 1, "last_append_event_id": ids[0]}})
        assert appended(first) == ids[:2]
        assert appended(second) == [ids[1], ids[2], ids[3]]  # a1 and a2 again, in order, then the new a3
        assert [e["type"] for e in second.sent] == ["session.resume"] + ["input_audio_buffer.append"] * 3
        assert client.input_resent == 2 and client.input_gaps == []
        await client._teardown()

    asyncio.run(run())


def test_resuming_client_against_a_server_without_the_receipt_is_duplexclient():
    async def run():
        (first, second), ids, client = await resuming_session(lambda ids: {})
        assert appended(second) == [ids[3]]  # nothing resent: a2 is lost, as with the stock client
        assert client.input_resent == 0
        await client._teardown()

    asyncio.run(run())


def test_resuming_client_records_a_gap_it_cannot_fill():
    async def run():
        (first, second), ids, client = await resuming_session(lambda ids: {"input_received": {
            "audio_bytes": 0, "appends": 0, "last_append_event_id": "evt_unknown"}})
        assert appended(second) == [ids[3]] and client.input_resent == 0
        assert client.input_gaps == ["append 'evt_unknown' is not in the journal"]
        await client._teardown()

    asyncio.run(run())
