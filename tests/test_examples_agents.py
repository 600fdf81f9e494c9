"""``examples/openai_agents_realtime.py`` (the openai-agents SDK, unmodified, on the OpenAI-compatible lane) against
a real simulator server, in-process through its ``main(argv)``.

Skipped where openai-agents is not installed (it pins websockets<17, so CI runs it in its own venv).
"""

from __future__ import annotations

import re
import wave

import pytest

from vllm_omni_voicechat.audio.speech import decode_speech
from vllm_omni_voicechat.server import ServerConfig

from .server_fixture import free_port, running_server
from .test_examples import load_example

pytest.importorskip("agents", reason="openai-agents is not installed")
pytest.importorskip("agents.realtime", reason="openai-agents is not installed")


@pytest.fixture(scope="module")
def server():
    with running_server(ServerConfig.simulator(max_sessions=2)) as url:
        yield url


def test_date_after_is_a_real_local_function():
    example = load_example("openai_agents_realtime")
    assert example.date_after.name == "date_after"
    schema = example.date_after.params_json_schema
    assert set(schema["properties"]) == {"start", "days"} and set(schema["required"]) == {"start", "days"}


def test_the_agent_calls_the_local_tool_and_speaks_its_result(server, tmp_path, capsys):
    example = load_example("openai_agents_realtime")
    out = tmp_path / "agents.wav"
    assert example.main(["--url", server, "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        'user: call date_after {"start": "2026-11-30", "days": 30}',
        "tool date_after({\"days\":30,\"start\":\"2026-11-30\"}) -> '2026-12-30, a Wednesday'",
        "assistant: The result is 2026-12-30, a Wednesday.",
    ]
    assert re.fullmatch(rf"\d+\.\d\d s of assistant audio -> {re.escape(str(out))}", lines[3]) and len(lines) == 4
    with wave.open(str(out), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 24_000)
        pcm = wav.readframes(wav.getnframes())
    assert decode_speech(pcm, 24_000).endswith("The result is 2026-12-30, a Wednesday.")


def test_spoken_and_typed_turns_in_one_session(server, tmp_path, capsys):
    example = load_example("openai_agents_realtime")
    assert example.main(["--url", server, "--say", "hello there", "--text", "good night",
                         "--out", str(tmp_path / "a.wav")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:4] == [
        "user: hello there",
        "assistant: You said: hello there.",
        "user: good night",
        "assistant: You said: good night.",
    ]


def test_no_server_is_a_clean_failure(tmp_path, capsys):
    example = load_example("openai_agents_realtime")
    assert example.main(["--url", f"ws://127.0.0.1:{free_port()}", "--out", str(tmp_path / "a.wav")]) == 1
    assert "failed:" in capsys.readouterr().err
