"""The simulator's real-speech mode (``serve --speech real``; sim/real_speech.py): PocketSphinx hears, eSpeak NG
speaks. Sentences spoken by eSpeak NG round-trip through the ear above a stated word accuracy; through the real
server, a spoken question gets the echo spoken back, a barge-in cuts real speech, a tool named aloud is called, and
typed input is spoken and heard.

The mode's tests skip without pocketsphinx (a test extra) or espeak-ng (scripts/install_espeak.sh), unless
``VOICECHAT_REQUIRE_SPEECH=1`` (CI) makes that a failure. The refusal without them and the token schedule always run.
"""

from __future__ import annotations

import asyncio
import base64
import difflib
import importlib.util
import os
import shutil

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES, OUTPUT_FRAME_SAMPLES
from vllm_omni_voicechat.client import V3Client
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.sim import real_speech
from vllm_omni_voicechat.sim.real_speech import SpeechUnavailable, check_available, token_schedule

from .server_fixture import running_server

AVAILABLE = importlib.util.find_spec("pocketsphinx") is not None and shutil.which("espeak-ng") is not None
needs_speech = pytest.mark.skipif(
    not AVAILABLE and os.environ.get("VOICECHAT_REQUIRE_SPEECH") != "1",
    reason=f"real speech needs pocketsphinx and espeak-ng: {real_speech.INSTALL}",
)

SENTENCES = [
    "What is the weather like in Paris today?", "please tell me a short story about a cat", "call local time",
    "hello there how are you doing", "I would like to know the time in London", "can you help me with my homework",
    "thank you very much", "what time is it now", "call get weather", "what is the local time",
]
WORD_ACCURACY = 0.6
"""The ear's word accuracy on SENTENCES spoken by eSpeak NG, one ear hearing them in turn (measured 0.73 with
pocketsphinx 5.1.1 and espeak-ng 1.51; the words recognised in order, over the words said). A synthetic voice is
harder for its en-us model than a person's."""
LOCAL_TIME = {"type": "function", "name": "local_time", "description": "The local time",
              "parameters": {"type": "object", "properties": {}}}


# ------------------------------------------------------------------------------------------------ always


def test_the_mode_refuses_to_start_without_its_packages_naming_the_install(monkeypatch):
    monkeypatch.setattr(real_speech.shutil, "which", lambda name: None)
    with pytest.raises(SpeechUnavailable, match=r"the espeak-ng program: pip install -e '\.\[voice\]' and bash "
                                                r"scripts/install_espeak\.sh"):
        check_available()
    with pytest.raises(SpeechUnavailable):
        ServerConfig.simulator(real_speech=True)


def test_serve_exits_with_the_install_command_when_the_mode_is_missing(monkeypatch, capsys):
    from vllm_omni_voicechat.cli import main

    monkeypatch.setattr(real_speech.shutil, "which", lambda name: None)
    assert main(["serve", "--speech", "real"]) == 2
    assert "scripts/install_espeak.sh" in capsys.readouterr().err


@given(st.integers(0, 200), st.integers(0, 200))
def test_the_reply_tokens_are_spread_over_its_frames_none_held_back(tokens, frames):
    schedule = token_schedule(tokens, frames)
    assert len(schedule) == frames
    if frames:
        assert sum(schedule) == tokens and max(schedule) - min(schedule) <= 1 + tokens // frames


# ------------------------------------------------------------------------------------------------ the ear


def heard(ear, pcm: np.ndarray) -> str:
    data = np.concatenate([pcm, np.zeros(16_000, dtype="<i2")]).tobytes()  # a second of silence after it
    pieces = []
    for i in range(0, len(data) - INPUT_FRAME_BYTES + 1, INPUT_FRAME_BYTES):
        pieces += ear.feed(data[i : i + INPUT_FRAME_BYTES]).pieces
    return " ".join(pieces)


def word_accuracy(said: str, heard_: str) -> float:
    words = [w.strip("?.,!").lower() for w in said.split()]
    matcher = difflib.SequenceMatcher(a=words, b=heard_.split())
    return sum(block.size for block in matcher.get_matching_blocks()) / len(words)


@needs_speech
def test_sentences_spoken_by_espeak_round_trip_through_the_ear():
    ear = real_speech.SphinxEar()
    scores = {s: word_accuracy(s, heard(ear, real_speech.espeak(s, 16_000))) for s in SENTENCES}
    assert np.mean(list(scores.values())) >= WORD_ACCURACY, scores
    assert scores["hello there how are you doing"] == scores["what is the local time"] == 1.0


@needs_speech
def test_silence_is_heard_as_nothing():
    ear = real_speech.SphinxEar()
    steps = [ear.feed(bytes(INPUT_FRAME_BYTES)) for _ in range(20)]
    assert all(s.pieces == () and not s.energetic for s in steps)


# ------------------------------------------------------------------------------------------------ the server


@pytest.fixture(scope="module")
def url():
    if not AVAILABLE:
        pytest.skip(f"real speech needs pocketsphinx and espeak-ng: {real_speech.INSTALL}")
    with running_server(ServerConfig.simulator(real_speech=True, settlement_blank_frames=6)) as base:
        yield f"{base}/v1/realtime"


def run(coro, limit: float = 60):
    return asyncio.run(asyncio.wait_for(coro, limit))


async def said(client: V3Client, k: int, text: str) -> str:
    await client.start_turn(k)
    await client.send_audio(real_speech.espeak(text, 16_000).tobytes() + bytes(8 * INPUT_FRAME_BYTES), paced=False)
    return await client.commit(k)


def reply_audio(text: str) -> bytes:
    return b"".join(real_speech.spoken_frames(text))


@needs_speech
def test_a_spoken_question_gets_the_echo_spoken_back_by_espeak(url):
    async def scenario():
        async with await V3Client.connect(url) as client:
            await client.configure(instructions="Be brief.")
            turn = await said(client, 1, "hello there how are you doing")
            response = await client.response_done((await client.response_for(turn)).response_id)
            transcript = next(e["transcript"] for e in client.events
                              if e["type"] == "conversation.item.input_audio_transcription.completed")
            return transcript, response

    transcript, response = run(scenario())
    assert transcript == "hello there how are you doing"
    assert (response.status, response.text) == ("completed", "You said: hello there how are you doing.")
    spoken, audio = reply_audio("You said: hello there how are you doing."), bytes(response.audio)
    start = audio.find(spoken)  # eSpeak NG's rendering, frame by frame, after the BOS position's silent frame
    assert start >= 0 and start % (2 * OUTPUT_FRAME_SAMPLES) == 0
    assert not any(audio[:start]) and not any(audio[start + len(spoken):])  # silence around it: BOS, the tail


@needs_speech
def test_a_barge_in_cuts_real_speech_where_it_is(url):
    async def scenario():
        async with await V3Client.connect(url) as client:
            await client.configure(instructions="Be brief.")
            first = await client.response_for(await said(client, 1, "please tell me a short story about a cat"))
            await client.wait_for(lambda e: e["type"] == "response.output_audio.delta"  # speech, not BOS's silence
                                  and e["response_id"] == first.response_id and any(base64.b64decode(e["delta"])))
            await client.start_turn(2)  # barge-in
            second = await said_after_start(client, 2, "thank you very much")
            done = await client.response_done((await client.response_for(second)).response_id)
            heard_first = next(e["transcript"] for e in client.events
                               if e["type"] == "conversation.item.input_audio_transcription.completed")
            return first, done, heard_first

    first, second, heard_first = run(scenario())
    assert (first.status, first.reason) == ("cancelled", "client_vad")
    whole = reply_audio(f"You said: {heard_first}.")  # what the first reply would have said, uncut
    assert any(first.audio) and len(first.audio) < len(whole)  # real speech was playing, and was cut
    assert second.status == "completed" and second.text.startswith("You said:")


async def said_after_start(client: V3Client, k: int, text: str) -> str:
    await client.send_audio(real_speech.espeak(text, 16_000).tobytes() + bytes(8 * INPUT_FRAME_BYTES), paced=False)
    return await client.commit(k)


@needs_speech
def test_a_tool_named_aloud_is_called_and_its_result_spoken(url):
    async def local_time(arguments: dict) -> str:
        return "noon"

    async def scenario():
        client = await V3Client.connect(url)
        client.register_tool("local_time", local_time)
        async with client:
            await client.configure(instructions="Be brief.", tools=[LOCAL_TIME])
            await said(client, 1, "what is the local time")
            call = await client.wait_for(lambda e: e["type"] == "response.function_call_arguments.done")
            run_ = await client.tool_run_done(call["call_id"])
            done = await client.response_done(call["response_id"])
            return call, run_, done

    call, run_, done = run(scenario())
    assert (call["name"], call["arguments"], run_.outcome) == ("local_time", "{}", "applied")
    assert done.text == "The result is noon." and len(done.audio) > 0


@needs_speech
def test_typed_input_is_spoken_by_espeak_and_heard_by_the_ear(url):
    async def scenario():
        async with await V3Client.connect(url) as client:
            await client.configure(instructions="Be brief.")
            job = await client.request_typed("j1", "hello there how are you doing")
            done = await client.wait_for(lambda e: e["type"] == "response.done")
            text = next(e["text"] for e in client.events if e["type"] == "response.output_text.done")
            return job, done, text

    job, done, text = run(scenario())
    assert job.accepted is True and done["status"] == "completed"
    assert text == "You said: hello there how are you doing."
