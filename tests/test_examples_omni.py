"""``examples/duplex_barge_in.py`` (vLLM-Omni's own DuplexClient with our preset) against a real simulator server,
in-process through its ``main(argv)``, for each barge-in policy.

Needs vLLM-Omni (CI runs it in the CPU vLLM-Omni venv); skipped elsewhere.
"""

from __future__ import annotations

import re
import wave

import pytest

from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.server import ServerConfig

from .compat import load_duplex_client_module
from .server_fixture import free_port, running_server
from .test_examples import load_example

load_duplex_client_module()  # skips without vllm-omni; stubs its heavy __init__ where vllm is absent
pytest.importorskip("vllm_omni", reason="vllm-omni is not installed")

QUESTION_ANSWER = "You said: Tell me a long story about the sea and the sky."
LINE = re.compile(r"response (\d) (\S+): (\w+)(?: \((\w+)\))? '(.*)' (\d+\.\d\d) s -> (.+)")


@pytest.fixture(scope="module")
def server():
    with running_server(ServerConfig.simulator(max_sessions=2)) as url:
        yield url


def write_16k_wav(path, text: str):
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(16_000)
        wav.writeframes(render_speech(text))
    return path


@pytest.mark.parametrize("policy, reason", [("vad", "barge_in"), ("model", "new_response"),
                                            ("cancel", "client_cancelled")])
def test_barge_in_cuts_the_first_answer_and_writes_one_wav_per_response(server, tmp_path, capsys, policy, reason):
    example = load_example("duplex_barge_in")
    argv = ["--url", f"{server}/v1/realtime", "--barge-in", policy, "--no-realtime", "--output-dir", str(tmp_path)]
    if policy == "model":  # also the WAV inputs
        argv += ["--question-wav", str(write_16k_wav(tmp_path / "q.wav", "Tell me a long story about the sea and the sky")),
                 "--interrupt-wav", str(write_16k_wav(tmp_path / "i.wav", "Stop, what time is it?"))]
    assert example.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[2] == "barge-in ok: the first answer was cut off, the second completed"
    first, second = (LINE.fullmatch(line) for line in lines[:2])
    assert first and second
    assert first.group(1, 3, 4) == ("1", "cancelled", reason)
    assert first[5] and QUESTION_ANSWER.startswith(first[5]) and first[5] != QUESTION_ANSWER
    assert second.group(1, 3, 4, 5) == ("2", "completed", None, "You said: Stop, what time is it?")
    assert first[2] != second[2]
    for match, index in ((first, 1), (second, 2)):
        assert match[7] == str(tmp_path / f"response_{index:02d}.wav")
        with wave.open(match[7], "rb") as wav:
            assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 22_050)
            pcm = wav.readframes(wav.getnframes())
        assert f"{len(pcm) / 2 / 22_050:.2f}" == match[6]
        assert decode_speech(pcm, 22_050) == match[5]  # each WAV is exactly its response's audio
    assert float(first[6]) >= 0.4  # it was interrupted after --interrupt-after-ms of answer audio


def test_barge_in_example_reports_a_connection_failure(tmp_path, capsys):
    example = load_example("duplex_barge_in")
    assert example.main(["--url", f"ws://127.0.0.1:{free_port()}/v1/realtime", "--no-realtime",
                         "--output-dir", str(tmp_path)]) == 1
    assert "duplex error" in capsys.readouterr().err

