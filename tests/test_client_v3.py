"""The asyncio v3 client against the real server (simulator model), plus its checks against a scripted fake."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import wave
from pathlib import Path

import pytest
from websockets.asyncio.server import serve

from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.client import ProtocolError, ServerError, SessionEnded, V3Client
from vllm_omni_voicechat.server import ServerConfig

from .server_fixture import running_server

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def url():
    with running_server(ServerConfig.simulator(settlement_blank_frames=3)) as base:
        yield f"{base}/v1/realtime"


def run(coro):
    """Run one scenario on a fresh event loop, bounded so a hang fails the test instead of the suite."""
    return asyncio.run(asyncio.wait_for(coro, 20))


async def configured(url: str, **kw) -> V3Client:
    client = await V3Client.connect(url)
    await client.configure(instructions="Keep answers short.", **kw)
    return client


async def spoken(client: V3Client, k: int, text: str, *, paced: bool = False) -> str:
    await client.start_turn(k)
    await client.send_audio(render_speech(text), paced=paced)
    return await client.commit(k)


def index(client: V3Client, predicate) -> int:
    return next(i for i, e in enumerate(client.events) if predicate(e))


# ==================================================================== against the real server


def test_handshake_and_configure_negotiates_model_output(url):
    async def scenario():
        client = await V3Client.connect(url)
        assert client.session_id and client.capabilities["input_turn_detection"] == "client_smart_turn_v1"
        assert client.events[0]["type"] == "session.created"
        updated = await client.configure(instructions="Be brief.", model_output=True)
        assert updated["session"]["protocol_version"] == 3
        assert client.model_output_mode == "client_authored_v1"
        with pytest.raises(RuntimeError):
            await client.configure(instructions="again")  # one session.update per session
        closed = await client.stop()
        assert closed["status"] == "completed" and closed["reason"] == "client_stop"
        assert client.close_code == 1000

        plain = await configured(url)  # model output not requested: the server must report null
        assert plain.model_output_mode is None and plain.session["instructions"] == "Keep answers short."
        await plain.stop()

    run(scenario())


def test_spoken_turn_end_to_end(url):
    async def scenario():
        async with await configured(url) as client:
            turn_id = await spoken(client, 1, "Hello, can you hear me?")
            created = await client.response_for(turn_id)
            response = await client.response_done(created.response_id)
            assert client.turns[turn_id].transcript == "Hello, can you hear me?"
            assert client.turns[turn_id].client_turn_id == 1
            assert (response.status, response.text) == ("completed", "You said: Hello, can you hear me?")
            assert decode_speech(bytes(response.audio), 22_050) == response.text
            # speech_started < turn_started < committed < response.created, all for one turn_id
            order = [
                index(client, lambda e, t=t: e["type"] == t and e.get("turn_id") == turn_id)
                for t in (
                    "input_audio_buffer.speech_started",
                    "input_audio_buffer.turn_started",
                    "input_audio_buffer.committed",
                    "response.created",
                    "response.done",
                )
            ]
            assert order == sorted(order)
        assert client.closed_event["status"] == "completed" and client.failure is None

    run(scenario())


def test_paced_audio_follows_the_real_time_schedule(url):
    async def scenario():
        async with await configured(url) as client:
            pcm = render_speech("Paced speech")  # 12 symbols of 20 ms = 0.24 s = 3 appends
            await client.start_turn(1)
            t0 = time.monotonic()
            await client.send_audio(pcm, paced=True)
            elapsed = time.monotonic() - t0
            assert 0.16 <= elapsed < 2.0  # appends at 0, 80 and 160 ms
            turn_id = await client.commit(1)
            response = await client.response_done((await client.response_for(turn_id)).response_id)
            assert response.text == "You said: Paced speech."

    run(scenario())


def test_typed_turn_and_rejection(url):
    async def scenario():
        async with await configured(url) as client:
            job = await client.request_typed("job-1", "What is the weather like?")
            assert job.accepted
            await client.wait_for(lambda e: e["type"] == "input_text.injection_finished" and e["job_id"] == "job-1")
            assert job.disposition == "completed" and job.injection_started
            turn = client.turns[job.turn_id]
            assert (turn.source, turn.job_id, turn.transcript) == ("typed", "job-1", "What is the weather like?")
            response = await client.response_done((await client.response_for(job.turn_id)).response_id)
            assert response.text == "You said: What is the weather like?"
            assert decode_speech(bytes(response.audio), 22_050) == response.text

            empty = await client.request_typed("job-2", "   ")
            assert (empty.accepted, empty.reason) == (False, "empty_text")
            with pytest.raises(ValueError):
                await client.request_typed("job-1", "reused id")

    run(scenario())


def test_barge_in_cancels_the_open_response(url):
    async def scenario():
        async with await configured(url) as client:
            story = await client.response_for(await spoken(client, 1, "Tell me a story about the sea"))
            await client.wait_for(
                lambda e: e["type"] == "response.output_text.delta" and e["response_id"] == story.response_id
            )
            assert client.current_response is story
            second = await client.start_turn(2)  # barge-in: the ack comes after the cancel terminal
            assert (story.status, story.reason) == ("cancelled", "client_vad")
            assert story.text_done and story.audio_done and story.text.startswith("You")
            cancelled = index(client, lambda e: e["type"] == "response.done" and e["status"] == "cancelled")
            started = index(client, lambda e: e["type"].endswith("speech_started") and e["turn_id"] == second)
            assert cancelled < started
            await client.send_audio(render_speech("Stop, thanks"), paced=False)
            assert await client.commit(2) == second
            last = await client.response_done((await client.response_for(second)).response_id)
            assert (last.status, last.text) == ("completed", "You said: Stop, thanks.")

    run(scenario())


def test_tool_result_without_tools_is_a_recoverable_error(url):
    async def scenario():
        async with await configured(url) as client:
            with pytest.raises(ServerError) as raised:
                await client.send_tool_result("call_0123", '{"ok":true}')
            assert (raised.value.code, raised.value.fatal) == ("tools_not_set", False)
            assert client.errors == [raised.value] and client.failure is None
            # the session is still usable
            turn_id = await spoken(client, 1, "Still there?")
            response = await client.response_done((await client.response_for(turn_id)).response_id)
            assert response.text == "You said: Still there?"

    run(scenario())


def test_stop_closes_an_open_response_and_the_session(url):
    async def scenario():
        client = await configured(url)
        response = await client.response_for(await spoken(client, 1, "Goodbye now"))
        closed = await client.stop()
        assert (closed["status"], closed["reason"]) == ("completed", "client_stop")
        assert (response.status, response.reason) == ("completed", "client_stop")
        assert client.close_code == 1000 and client.failure is None
        with pytest.raises(SessionEnded):
            await client.start_turn(2)
        types = [e["type"] async for e in client]  # the recorded events, then the iterator ends
        assert types[0] == "session.created" and types[-1] == "session.closed"
        assert types.index("response.done") < types.index("session.closed")

    run(scenario())


def test_busy_server_is_a_fatal_error():
    async def scenario(url):
        first = await V3Client.connect(url)
        with pytest.raises(ServerError) as raised:
            await V3Client.connect(url)
        assert (raised.value.code, raised.value.fatal) == ("server_busy", True)
        await first.stop()

    with running_server(ServerConfig.simulator(max_sessions=1)) as base:
        run(scenario(f"{base}/v1/realtime"))


def test_example_conversation_script(tmp_path):
    wav_path = tmp_path / "assistant.wav"
    with running_server(ServerConfig.simulator(settlement_blank_frames=3)) as base:
        proc = subprocess.run(
            [sys.executable, "examples/v3_conversation.py", "--url", f"{base}/v1/realtime", "--wav", str(wav_path)]
            + ["--no-paced"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "user (microphone): Hello, can you hear me?" in out
    assert "assistant: You said: Hello, can you hear me?  [completed: post_eos_audio_silence]" in out
    assert "user (typed): What is the weather like?" in out
    assert "audio says: You said: What is the weather like?" in out
    assert "[cancelled: client_vad]" in out
    assert "assistant: You said: Stop, thanks.  [completed" in out
    assert "session completed (client_stop), close code 1000" in out
    with wave.open(str(wav_path), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 22_050)
        pcm = wav.readframes(wav.getnframes())
    heard = decode_speech(pcm, 22_050)
    assert "You said: Hello, can you hear me?" in heard and "You said: Stop, thanks." in heard


def test_example_exits_non_zero_without_a_server():
    from .server_fixture import free_port

    proc = subprocess.run(
        [sys.executable, "examples/v3_conversation.py", "--url", f"ws://127.0.0.1:{free_port()}/v1/realtime"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode != 0


# ==================================================================== the client's own checks, on a scripted fake

CAPS = {"input_turn_detection": "client_smart_turn_v1", "function_output_model_output": {"mode": "client_authored_v1"}}
PROTO = {"name": "voicechat.realtime", "version": 3}


class Fake:
    """One scripted server connection: ``emit`` stamps the v3 envelope (session ``S``, unique event ids)."""

    def __init__(self, ws) -> None:
        self.ws, self.n = ws, 0

    async def emit(self, type_: str, **fields) -> None:
        self.n += 1
        await self.ws.send(json.dumps({"type": type_, "event_id": f"e{self.n}", "session_id": "S", **fields}))

    async def greet(self, protocol=PROTO, caps=CAPS) -> None:
        await self.emit("session.created", protocol=protocol, capabilities=caps, session={"id": "S"})

    async def recv(self) -> dict:
        return json.loads(await self.ws.recv())

    async def open_turn(self, *, echo: str | None = None) -> None:
        """Answer the client's turn_start with speech_started + turn_started (echoing ``echo`` if given)."""
        start = await self.recv()
        await self.emit("input_audio_buffer.speech_started", turn_id="T1", source="microphone", job_id=None,
                        correlation=1)
        await self.emit("input_audio_buffer.turn_started", turn_id="T1", client_turn_id=1,
                        client_event_id=echo or start["event_id"])


async def fake_server(script):
    """A WebSocket server running ``script(Fake)`` per connection; returns (server, url)."""

    async def handler(ws):
        try:
            await script(Fake(ws))
            await ws.wait_closed()
        except Exception:
            pass

    server = await serve(handler, "127.0.0.1", 0, ping_interval=None)
    port = server.sockets[0].getsockname()[1]
    return server, f"ws://127.0.0.1:{port}/v1/realtime"


@pytest.mark.parametrize(
    "greeting",
    [
        lambda fake: fake.greet(protocol={"name": "voicechat.realtime", "version": 2}),
        lambda fake: fake.greet(caps={"input_turn_detection": "server_rnnt"}),
        lambda fake: fake.emit("session.updated", session={"id": "S", "protocol_version": 3}),
    ],
    ids=["version-2", "server-turn-detection", "not-session-created"],
)
def test_a_bad_greeting_is_a_protocol_error(greeting):
    async def scenario():
        server, url = await fake_server(greeting)
        async with server:
            with pytest.raises(ProtocolError):
                await V3Client.connect(url)

    run(scenario())


def test_a_mismatched_barrier_ack_is_a_protocol_error():
    async def script(fake: Fake):
        await fake.greet()
        await fake.open_turn(echo="client_evt_not_the_barrier")

    async def scenario():
        server, url = await fake_server(script)
        async with server:
            client = await V3Client.connect(url)
            with pytest.raises(ProtocolError, match="client_event_id"):
                await client.start_turn(1)
            assert isinstance(client.failure, ProtocolError)
            with pytest.raises(ProtocolError):  # the failure is sticky
                await client.commit(1)

    run(scenario())


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"type": "response.created", "response_id": "R2"}, "while another is open"),
        ({"type": "response.output_audio.delta", "sample_rate": 24_000, "delta": "AAAA"}, "pcm16/22050/1"),
        ({"type": "response.output_audio.delta", "sample_rate": 22_050, "delta": "A!=="}, "base64"),
        ({"type": "response.output_text.delta", "delta": "Hi", "text": "Oops"}, "not cumulative"),
    ],
    ids=["second-open-response", "audio-rate", "audio-base64", "text-not-cumulative"],
)
def test_response_violations_are_protocol_errors(bad, message):
    async def script(fake: Fake):
        await fake.greet()
        await fake.open_turn()
        commit = await fake.recv()
        await fake.emit("input_audio_buffer.committed", turn_id="T1", client_turn_id=1,
                        client_event_id=commit["event_id"])
        await fake.emit("conversation.item.input_audio_transcription.completed", turn_id="T1", transcript="",
                        empty=True, source="microphone", job_id=None)
        await fake.emit("response.created", turn_id="T1", response_id="R1")
        fields = {"turn_id": "T1", "response_id": "R1", "encoding": "pcm16", "channels": 1, **bad}
        await fake.emit(fields.pop("type"), **fields)

    async def scenario():
        server, url = await fake_server(script)
        async with server:
            client = await V3Client.connect(url)
            await client.start_turn(1)
            assert (await client.response_for(await client.commit(1))).response_id == "R1"
            with pytest.raises(ProtocolError, match=message):
                await client.wait_for("never.sent", timeout=5)

    run(scenario())



def test_stop_waits_for_the_server_s_close_which_follows_the_release():
    """``stop`` waits for the server's close after ``session.closed`` instead of closing first. The server closes
    only once the session is released (model aborted, slot freed), so when ``stop`` returns a client can reconnect
    at once (inside vllm-omni serve the engine e2e saw a slot still held right after the client's own close).
    A trace observer holds the server's loop for 0.3 s just before its close frame: a client that closed first
    would be the one to send the first close."""
    from .server_fixture import running_app

    class HoldBeforeClose:
        def client_event(self, message):
            pass

        def server_event(self, message):
            pass

        def transport_closed(self, code):
            if code is not None:
                time.sleep(0.3)  # ok: widens the window between session.closed and the close frame

    config = ServerConfig.simulator(settlement_blank_frames=3, max_sessions=1,
                                    trace_factory=lambda dialect: HoldBeforeClose())
    with running_app(config) as (base, app):
        async def main():
            client = await configured(f"{base}/v1/voicechat")
            closed = await client.stop()
            return closed, client._ws.protocol.close_rcvd_then_sent, app.admission.active

        closed, server_closed_first, active = run(main())
        assert closed["type"] == "session.closed" and closed["reason"] == "client_stop"
        assert server_closed_first is True and active == 0
