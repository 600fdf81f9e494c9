"""The examples that need only the lean venv, run in-process (``main(argv)``) against a real simulator server.

``duplex_barge_in.py`` is in test_examples_omni.py (vLLM-Omni's DuplexClient), ``openai_agents_realtime.py`` in
test_examples_agents.py (the openai-agents SDK); ``v3_conversation.py`` without ``--tools`` in test_client_v3.py.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import wave
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import pytest

from vllm_omni_voicechat.audio.speech import decode_speech
from vllm_omni_voicechat.server import ServerConfig

from .server_fixture import free_port, running_server

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` as a module (registered first: its dataclasses need ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def wav_pcm(path: Path, rate: int = 22_050) -> bytes:
    with wave.open(str(path), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, rate)
        return wav.readframes(wav.getnframes())


@pytest.fixture(scope="module")
def server():
    with running_server(ServerConfig.simulator(settlement_blank_frames=3)) as url:
        yield url


# ----------------------------------------------------------------------------------------------- typed input


def test_typed_input_example(server, tmp_path, capsys):
    typed = load_example("typed_input")
    wav = tmp_path / "typed.wav"
    rc = typed.main(["--url", server, "--text", "good morning", "--text", "read this back", "--wav", str(wav)])
    lines = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert lines == [
        "you (typed): good morning  [heard: 'good morning', job completed]",
        "assistant: You said: good morning.  [completed]",
        "you (typed): read this back  [heard: 'read this back', job completed]",
        "assistant: You said: read this back.  [completed]",
        lines[-1],
    ]
    assert re.fullmatch(rf"\d+\.\d\d s of assistant audio -> {re.escape(str(wav))}", lines[-1])
    assert decode_speech(wav_pcm(wav), 22_050) == "You said: good morning.You said: read this back."


def test_typed_input_example_reads_stdin_until_an_empty_line(server, tmp_path, capsys, monkeypatch):
    import io

    typed = load_example("typed_input")
    monkeypatch.setattr(sys, "stdin", io.StringIO("first line\n\nnever sent\n"))
    assert typed.main(["--url", server, "--interactive", "--wav", str(tmp_path / "t.wav")]) == 0
    out = capsys.readouterr().out
    assert "you (typed): first line  [heard: 'first line', job completed]" in out and "never sent" not in out


def test_typed_input_example_without_a_server(capsys):
    typed = load_example("typed_input")
    assert typed.main(["--url", f"ws://127.0.0.1:{free_port()}", "--text", "x"]) == 2
    assert "cannot reach" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- tool call


def test_local_time_is_computed_locally_from_the_offset_table():
    tool = load_example("tool_call")
    noon_utc = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    assert tool.local_time("Tokyo", noon_utc) == "21:00 in Tokyo (UTC+09:00)"
    assert tool.local_time(" new york ", noon_utc) == "07:00 in New York (UTC-05:00)"
    assert tool.local_time("Mumbai", noon_utc) == "17:30 in Mumbai (UTC+05:30)"
    assert tool.local_time("Atlantis", noon_utc) == "I do not know the time zone of Atlantis"


def test_tool_call_example_runs_the_local_function_and_speaks_its_result(server, capsys):
    tool = load_example("tool_call")
    before = datetime.now(UTC)
    rc = tool.main(["--url", server, "--city", "Tokyo", "--no-paced"])
    after = datetime.now(UTC)
    lines = capsys.readouterr().out.splitlines()
    assert rc == 0
    # The clock may tick between the call and this check: accept the answer for either end of the run.
    results = {tool.local_time("Tokyo", before), tool.local_time("Tokyo", after)}
    assert lines[0] == 'user: call local_time {"city": "Tokyo"}'
    match = re.fullmatch(r"tool call local_time\(\{\"city\":\"Tokyo\"\}\) -> '(.*)' \[applied\]", lines[1])
    assert match and match[1] in results
    assert lines[2:] == [f"assistant: The result is {match[1]}.  [completed]"]


# ----------------------------------------------------------------------------------------------- older examples


def test_scripted_conversation_example_on_the_virtual_clock(tmp_path, capsys):
    scripted = load_example("scripted_conversation")
    wav = tmp_path / "assistant.wav"
    assert scripted.main(["--wav", str(wav)]) == 0
    out = capsys.readouterr().out
    assert "user (microphone): Hello there, can you hear me?" in out
    assert "assistant: You said: Hello there, can you hear me?  [completed" in out
    assert "user (typed): What is the weather like?" in out
    assert "typed job typed-1: completed" in out
    assert re.search(r"assistant: .*\[cancelled: ", out)  # the barged-in story
    assert "assistant: You said: Stop, thanks.  [completed" in out
    assert "You said: Stop, thanks." in decode_speech(wav_pcm(wav), 22_050)


def test_v3_conversation_example_with_its_tool_turn(server, tmp_path, capsys):
    conversation = load_example("v3_conversation")
    rc = conversation.main(["--url", server + "/v1/voicechat", "--no-paced", "--tools", "--wav", str(tmp_path / "a.wav")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "tool get_weather({\"city\":\"Paris\"}) -> 'sunny in Paris': applied" in out
    assert "assistant: The result is sunny in Paris.  [completed" in out
