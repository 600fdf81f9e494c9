"""The official ``openai`` SDK (3.57, GA realtime) through every OpenAI Realtime flow this model can serve, over
``/v1/realtime?model=sim`` on the in-process server (docs/tiered-dialect.md §3.4 "Manual turns", §13).

Each flow drives ``AsyncOpenAI(base_url=..., api_key="x").realtime.connect(model="sim")`` (the SDK builds every
client event and parses every server event), asserts the exact server event types of the flow (deltas
collapsed), and that no ``error`` event went out where OpenAI would send none. Flows the model cannot serve
get their exact error. Every socket also goes through the server's trace checker (``server_fixture``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
import soxr

from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.server import ServerConfig

from .compat import validate_openai_server_event
from .server_fixture import running_app

openai = pytest.importorskip("openai", reason="the openai SDK is not installed (the test extra pins 3.57.0)")

RATE = 24_000  # GA audio/pcm
CHUNK = 4_800  # 100 ms of 24 kHz PCM16
SILENCE_1S = bytes(2 * RATE)
TIMEOUT_S = 30.0
TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
MANUAL = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
SERVER_VAD = {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad"}}}}

# The event types of one flow's pieces, deltas collapsed (see ``collapse``).
USER_COMMIT = ["conversation.item.added", "conversation.item.created", "input_audio_buffer.committed",
               "conversation.item.input_audio_transcription.completed", "conversation.item.done"]
VAD_TURN = ["input_audio_buffer.speech_started", "conversation.item.input_audio_transcription.delta+",
            "input_audio_buffer.speech_stopped", *USER_COMMIT]
RESPONSE_OPEN = ["response.created", "conversation.item.added", "conversation.item.created",
                 "response.output_item.added", "response.content_part.added"]
RESPONSE_CLOSE = ["response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
                  "response.output_item.done", "conversation.item.done", "response.done", "rate_limits.updated"]
SPOKEN_RESPONSE = [*RESPONSE_OPEN, "(audio.delta transcript.delta)+", *RESPONSE_CLOSE]


def speech_24k(text: str) -> bytes:
    pcm16 = np.frombuffer(render_speech(text), dtype="<i2")
    return soxr.resample(pcm16, 16_000, RATE).astype("<i2").tobytes()


def collapse(kinds: list[str]) -> list[str]:
    """Runs of audio/transcript deltas become one ``(audio.delta transcript.delta)+``; runs of one type ``type+``."""
    out: list[str] = []
    for k in kinds:
        if k in ("response.output_audio.delta", "response.output_audio_transcript.delta"):
            k = "(audio.delta transcript.delta)+"
        elif k == "conversation.item.input_audio_transcription.delta":
            k = k + "+"
        if not out or out[-1] != k:
            out.append(k)
    return out


class Flow:
    """One SDK connection: every server event it parsed, as the SDK's model and as a dict."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.events: list[Any] = []
        self._seen = 0

    @property
    def dicts(self) -> list[dict]:
        return [e.model_dump(exclude_unset=True) for e in self.events]

    def errors(self) -> list[dict]:
        return [e.error.model_dump(exclude_none=True) for e in self.events if e.type == "error"]

    async def until(self, type_: str, where: Callable[[Any], bool] = lambda e: True) -> list[Any]:
        """Receive until an event of ``type_`` (matching ``where``) arrives; returns the events since the last call."""
        async def loop() -> None:
            while True:
                e = await self.conn.recv()
                self.events.append(e)
                if e.type == type_ and where(e):
                    return

        await asyncio.wait_for(loop(), TIMEOUT_S)
        out, self._seen = self.events[self._seen:], len(self.events)
        return out

    async def update(self, session: dict) -> list[Any]:
        await self.conn.session.update(session=session)
        return await self.until("session.updated")

    async def push_to_talk(self, pcm: bytes) -> None:
        """The OpenAI push-to-talk turn: the audio, its commit, then ``response.create``."""
        await self.append(pcm)
        await self.conn.input_audio_buffer.commit()
        await self.conn.response.create()

    async def append(self, pcm: bytes) -> None:
        for i in range(0, len(pcm), CHUNK):
            await self.conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i:i + CHUNK]).decode())

    async def marker(self) -> list[Any]:
        """A round trip: everything the server sent in answer to the events before it has arrived."""
        await self.conn.send({"type": "conversation.item.retrieve", "item_id": "no_such_item", "event_id": "marker"})
        return await self.until("error", lambda e: e.error.event_id == "marker")


@contextlib.asynccontextmanager
async def connect(base: str, session: dict | None = None) -> AsyncIterator[Flow]:
    client = openai.AsyncOpenAI(base_url=base.replace("ws://", "http://") + "/v1", api_key="x")
    async with client.realtime.connect(model="sim") as conn:
        flow = Flow(conn)
        assert [e.type for e in await flow.until("session.created")] == ["session.created"]
        if session is not None:
            assert [e.type for e in await flow.update(session)] == ["session.updated"]
        yield flow
    # the SDK parsed everything; the GA schema holds for every event as sent
    assert all(validate_openai_server_event(d) for d in flow.dicts)


def kinds(events: list[Any]) -> list[str]:
    return collapse([e.type for e in events])


def reply(events: list[Any]) -> tuple[str, str]:
    """(the transcript, the decoded speech) of the one response in ``events``."""
    audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    transcript = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    return transcript, decode_speech(audio, RATE)


def done_of(events: list[Any]) -> Any:
    """The ``response`` of the one ``response.done`` in ``events``."""
    (done,) = [e.response for e in events if e.type == "response.done"]
    return done


def user_transcript(events: list[Any]) -> list[str]:
    return [e.transcript for e in events if e.type == "conversation.item.input_audio_transcription.completed"]


@pytest.fixture(scope="module")
def base():
    with running_app(ServerConfig.simulator(max_sessions=2)) as (url, _):
        yield url


def run(flow: Callable[[], Any]) -> None:
    asyncio.run(flow())


# ==================================================================================================== manual turns


def test_push_to_talk_commit_then_response_create_answers_once_without_errors(base):
    async def flow() -> None:
        async with connect(base, MANUAL) as f:
            await f.push_to_talk(speech_24k("hello there"))
            events = await f.until("rate_limits.updated")
            assert kinds(events) == [*USER_COMMIT, *SPOKEN_RESPONSE]
            assert user_transcript(events) == ["hello there"]
            assert reply(events) == ("You said: hello there.", "You said: hello there.")
            done = done_of(events)
            assert (done.status, done.status_details) == ("completed", None)
            assert [e.type for e in await f.marker()] == ["error"]
            assert f.errors() == [{"type": "invalid_request_error", "code": "item_not_found",
                                   "message": "no item 'no_such_item'", "event_id": "marker", "param": "item_id"}]

    run(flow)


def test_push_to_talk_two_turns_each_answered_at_its_response_create(base):
    async def flow() -> None:
        async with connect(base, MANUAL) as f:
            for text in ("hello there", "good morning"):
                await f.append(speech_24k(text))
                await f.conn.input_audio_buffer.commit()
                committed = await f.until("conversation.item.done")
                assert kinds(committed) == USER_COMMIT and user_transcript(committed) == [text]
                await f.conn.response.create()
                events = await f.until("rate_limits.updated")
                assert kinds(events) == SPOKEN_RESPONSE and reply(events)[0] == f"You said: {text}."
            assert f.errors() == []

    run(flow)


# ==================================================================================================== model turns


@pytest.mark.parametrize("session", [None, SERVER_VAD], ids=["default_semantic_vad", "server_vad"])
def test_the_model_answers_its_own_end_of_turn(base, session):
    async def flow() -> None:
        async with connect(base, session) as f:
            await f.append(speech_24k("hello there") + SILENCE_1S)
            events = await f.until("rate_limits.updated")
            assert kinds(events) == [*VAD_TURN, *SPOKEN_RESPONSE]
            assert reply(events)[0] == "You said: hello there."
            assert [e.type for e in await f.marker()] == ["error"]
            assert [e["code"] for e in f.errors()] == ["item_not_found"]

    run(flow)


def test_a_response_create_while_the_model_opens_or_speaks_its_answer_is_absorbed(base):
    async def flow() -> None:
        async with connect(base, SERVER_VAD) as f:
            await f.append(speech_24k("hello there") + SILENCE_1S)
            await f.until("input_audio_buffer.committed")
            await f.conn.response.create()  # being opened
            await f.until("response.output_audio.delta")
            await f.conn.response.create()  # open
            events = f.events + await f.until("rate_limits.updated")
            assert [e.type for e in events].count("response.created") == 1
            await f.marker()
            assert [e["code"] for e in f.errors()] == ["item_not_found"]  # the marker's, nothing else

    run(flow)


def test_server_vad_commit_then_response_create_answers_once(base):
    """With server_vad a client commit forces the model's own end of turn; its response.create is absorbed."""
    async def flow() -> None:
        async with connect(base, SERVER_VAD) as f:
            await f.push_to_talk(speech_24k("hello there"))
            events = await f.until("rate_limits.updated")
            assert [e.type for e in events].count("response.created") == 1
            assert reply(events)[0] == "You said: hello there."
            await f.marker()
            assert [e["code"] for e in f.errors()] == ["item_not_found"]

    run(flow)


# ==================================================================================================== typed text, tools


def test_typed_text_item_then_response_create(base):
    async def flow() -> None:
        async with connect(base, MANUAL) as f:
            await f.conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Good morning"}]})
            added = await f.until("conversation.item.done")
            assert kinds(added) == ["conversation.item.added", "conversation.item.created", "conversation.item.done"]
            await f.conn.response.create()
            events = await f.until("rate_limits.updated")
            assert kinds(events) == SPOKEN_RESPONSE
            assert reply(events) == ("You said: Good morning.", "You said: Good morning.")
            assert f.errors() == []

    run(flow)


def test_tool_call_function_call_output_then_response_create(base):
    async def flow() -> None:
        async with connect(base, {**MANUAL, "tools": [TOOL]}) as f:
            await f.push_to_talk(speech_24k('call get_weather {"city": "Paris"}'))
            first = await f.until("rate_limits.updated")
            call = [e for e in first if e.type == "response.function_call_arguments.done"]
            assert [(c.name, c.arguments) for c in call] == [("get_weather", '{"city":"Paris"}')]
            assert done_of(first).status == "completed"
            # only the call: the silence before it is no message (Pipecat would play it as the bot speaking)
            assert [o.type for o in done_of(first).output] == ["function_call"]
            assert not [e for e in first if e.type.startswith("response.output_audio")]
            await f.conn.conversation.item.create(item={"type": "function_call_output", "call_id": call[0].call_id,
                                                        "output": '{"temp_c": 21}'})
            await f.conn.response.create()
            second = await f.until("rate_limits.updated")
            assert kinds(second)[:3] == ["conversation.item.added", "conversation.item.created",
                                         "conversation.item.done"]  # the output item, then response B
            assert kinds(second)[3:] == SPOKEN_RESPONSE
            assert reply(second)[0] == 'The result is {"temp_c":21}.'  # the simulator's compact JSON
            assert f.errors() == []

    run(flow)


# ============================================================================================= cancel, truncate, clear


def test_cancel_mid_response(base):
    async def flow() -> None:
        async with connect(base, MANUAL) as f:
            await f.push_to_talk(speech_24k("tell me a long story about the sea"))
            await f.until("response.output_audio.delta")
            await f.conn.response.cancel()
            events = await f.until("rate_limits.updated")
            done = done_of(events)
            assert (done.status, done.status_details.reason) == ("cancelled", "client_cancelled")
            assert kinds(events)[-7:] == RESPONSE_CLOSE
            # the next push-to-talk turn is answered as usual
            await f.push_to_talk(speech_24k("hello there"))
            events = await f.until("response.done", lambda e: e.response.status == "completed")
            assert reply(events)[0] == "You said: hello there."
            assert f.errors() == []

    run(flow)


def test_truncate_after_partial_playback(base):
    async def flow() -> None:
        async with connect(base, MANUAL) as f:
            await f.push_to_talk(speech_24k("hello there"))
            events = await f.until("rate_limits.updated")
            item_id = done_of(events).output[0].id
            await f.conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=400)
            truncated = await f.until("conversation.item.truncated")
            assert [(e.item_id, e.content_index, e.audio_end_ms) for e in truncated[-1:]] == [(item_id, 0, 400)]
            await f.conn.conversation.item.retrieve(item_id=item_id)
            item = (await f.until("conversation.item.retrieved"))[-1].item
            cut = item.content[0].transcript
            assert cut and "You said: hello there.".startswith(cut) and cut != "You said: hello there."
            assert f.errors() == []

    run(flow)


def test_input_audio_buffer_clear_drops_what_was_appended(base):
    async def flow() -> None:
        async with connect(base, MANUAL) as f:
            await f.append(speech_24k("never mind"))
            await f.conn.input_audio_buffer.clear()
            assert [e.type for e in await f.until("input_audio_buffer.cleared")] == ["input_audio_buffer.cleared"]
            await f.push_to_talk(speech_24k("hello there"))
            events = await f.until("rate_limits.updated")
            assert user_transcript(events) == ["hello there"]
            assert reply(events)[0] == "You said: hello there."
            assert f.errors() == []

    run(flow)


# ==================================================================================================== re-configuration


def test_session_reconfiguration_between_turns(base):
    """Manual → server VAD → manual, and an unchanged resend (as openai-agents does) between turns."""
    async def flow() -> None:
        async with connect(base, {**MANUAL, "instructions": "Be brief."}) as f:
            await f.push_to_talk(speech_24k("good morning"))
            assert reply(await f.until("rate_limits.updated"))[0] == "You said: good morning."

            updated = (await f.update({**SERVER_VAD, "instructions": "Be brief."}))[-1].session
            assert updated.audio.input.turn_detection.type == "server_vad"
            await f.append(speech_24k("how are you") + SILENCE_1S)
            events = await f.until("rate_limits.updated")
            assert "input_audio_buffer.speech_started" in kinds(events)
            assert reply(events)[0] == "You said: how are you."

            updated = (await f.update(MANUAL))[-1].session
            assert updated.audio.input.turn_detection is None
            await f.append(speech_24k("see you later"))
            await f.conn.input_audio_buffer.commit()
            committed = await f.until("conversation.item.done")
            assert kinds(committed) == USER_COMMIT  # no speech events without turn detection
            await f.conn.response.create()
            assert reply(await f.until("rate_limits.updated"))[0] == "You said: see you later."
            assert f.errors() == []

    run(flow)


# =============================================================================================== what it cannot serve


UNSERVABLE = [
    # (what the client sends, the exact error: code, param)
    ({"type": "response.create", "response": {"conversation": "none"}},
     "unsupported_native_response_options", "response.conversation"),
    ({"type": "response.create", "response": {"input": []}}, "unsupported_native_response_options", "response.input"),
    ({"type": "response.create", "response": {"output_modalities": ["text"]}},
     "unsupported_native_response_options", "response.output_modalities"),
    ({"type": "response.create", "response": {"audio": {"output": {"format": {"type": "audio/pcmu"}}}}},
     "unsupported_native_response_options", "response.audio.output.format"),
    ({"type": "response.create", "response": {"audio": {"output": {"voice": "marin"}}}},
     "unsupported_native_response_options", "response.audio.output.voice"),
    ({"type": "response.create", "response": {"max_output_tokens": 20}},
     "unsupported_native_response_options", "response.max_output_tokens"),
    ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_empty", None),
    ({"type": "response.cancel"}, "response_cancel_not_active", "response_id"),  # OpenAI's code
    ({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "create_response": False}}}}}, "unsupported_turn_detection",
     "turn_detection.create_response"),
    ({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "interrupt_response": False}}}}}, "unsupported_turn_detection", "turn_detection"),
]


def test_the_model_speaks_first_when_asked_before_anyone_spoke_and_hears_per_response_instructions(base):
    """Pipecat's first LLMRunFrame and LiveKit's greeting send response.create over an empty conversation: the
    model speaks first (the simulator greets). Per-response instructions (LiveKit's generate_reply) are what the
    model hears, as typed input: its instructions are its prompt, resident since the session's first position."""
    async def flow() -> None:
        async with connect(base, {**MANUAL, "instructions": "Be brief."}) as f:
            await f.conn.send({"type": "response.create", "event_id": "greet",
                               "response": {"metadata": {"client_event_id": "greet"}}})
            first = await f.until("rate_limits.updated")
            assert reply(first)[0] == "Hello! How can I help?"
            assert [e.type for e in first if e.type.startswith("conversation.item.input_audio")] == []  # no user item
            assert done_of(first).metadata == {"client_event_id": "greet"}
            await f.conn.send({"type": "response.create", "event_id": "say",
                               "response": {"instructions": "Be brief.\nSay hello to Ada."}})
            second = await f.until("rate_limits.updated")
            assert reply(second)[0] == "You said: Say hello to Ada."
            assert f.errors() == []

    run(flow)


def test_flows_the_model_cannot_serve_get_their_exact_error(base):
    async def flow() -> None:
        async with connect(base, MANUAL) as f:
            for i, (event, code, param) in enumerate(UNSERVABLE):
                await f.conn.send({**event, "event_id": f"e{i}"})
                await f.until("error", lambda e, i=i: e.error.event_id == f"e{i}")
            got = [(e["code"], e.get("param"), e["event_id"]) for e in f.errors()]
            assert got == [(code, param, f"e{i}") for i, (_, code, param) in enumerate(UNSERVABLE)]
            assert all(e["type"] == "invalid_request_error" for e in f.errors())
            # nothing of it changed the session: a push-to-talk turn still works
            await f.push_to_talk(speech_24k("hello there"))
            assert reply(await f.until("rate_limits.updated"))[0] == "You said: hello there."

    run(flow)


def test_a_push_to_talk_commit_of_silence_is_refused_and_so_is_its_response_create(base):
    """The model heard no speech, so nothing is committed and there is nothing to answer (OpenAI would commit an
    empty item and answer it): both client events get their error instead of a response that never comes."""
    async def flow() -> None:
        async with connect(base, MANUAL) as f:
            await f.append(SILENCE_1S)
            await f.conn.send({"type": "input_audio_buffer.commit", "event_id": "c1"})
            await f.conn.send({"type": "response.create", "event_id": "r1"})
            events = await f.until("error", lambda e: e.error.event_id == "r1")
            assert [e.type for e in events] == ["error", "error"]
            assert [(e["code"], e["event_id"]) for e in f.errors()] == [
                ("input_audio_buffer_empty", "c1"), ("response_create_without_input", "r1")]
            # the next turn is served
            await f.push_to_talk(speech_24k("hello there"))
            assert reply(await f.until("rate_limits.updated"))[0] == "You said: hello there."
            assert len(f.errors()) == 2

    run(flow)


def test_instructions_cannot_change_once_the_model_has_started(base):
    async def flow() -> None:
        async with connect(base, {**MANUAL, "instructions": "Be brief."}) as f:
            await f.push_to_talk(speech_24k("hello"))
            await f.until("rate_limits.updated")
            await f.conn.session.update(session={"type": "realtime", "instructions": "Be verbose."})
            await f.until("error")
            assert [(e["code"], e.get("param")) for e in f.errors()] == [
                ("instructions_update_unsupported", "instructions")]

    run(flow)


def test_response_create_while_a_manual_response_is_open_is_an_error(base):
    """As OpenAI (conversation_already_has_active_response): client-owned turns start one response at a time."""
    async def flow() -> None:
        async with connect(base, MANUAL) as f:
            await f.push_to_talk(speech_24k("hello there"))
            await f.until("response.output_audio.delta")
            await f.conn.send({"type": "response.create", "event_id": "again"})
            await f.until("error")
            await f.until("rate_limits.updated")
            assert [(e["code"], e["event_id"]) for e in f.errors()] == [
                ("conversation_already_has_active_response", "again")]  # OpenAI's code

    run(flow)
