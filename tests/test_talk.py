"""``vllm-omni-voicechat talk``: its WAV reader, its pure timing extraction, its argument order, and the command
end to end against a real in-process simulator server over a real WebSocket (whose fixture also checks every
socket's trace invariants server-side)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import wave

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.audio.wav import load_wav_16k, read_wav
from vllm_omni_voicechat.cli import build_parser
from vllm_omni_voicechat.cli import main as cli_main
from vllm_omni_voicechat.client.talk import TalkInput, turn_timings, v3_url
from vllm_omni_voicechat.server import ServerConfig

from .server_fixture import free_port, running_server


def riff(fmt_tag: int, channels: int, rate: int, bits: int, data: bytes, *, extensible: bool = False) -> bytes:
    """A WAV file built by hand (the stdlib writes PCM only): ``fmt `` (optionally EXTENSIBLE), then ``data``."""
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", 0xFFFE if extensible else fmt_tag, channels, rate, rate * block, block, bits)
    if extensible:  # cbSize, valid bits, channel mask, then the sub-format GUID whose first 2 bytes are the tag
        fmt += struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", fmt_tag) + bytes(14)
    odd = b"\x00" if len(data) % 2 else b""
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"LIST" + struct.pack("<I", 3) + b"abc\x00"  # an odd-sized chunk to skip (word-aligned)
    body += b"data" + struct.pack("<I", len(data)) + data + odd
    return b"RIFF" + struct.pack("<I", len(body)) + body


# ----------------------------------------------------------------------------------------------- WAV input


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-32768, 32767), min_size=1, max_size=400), st.sampled_from([1, 2]))
def test_16k_pcm16_passes_through_bit_exact_and_mono_mixes_equal_channels_exactly(tmp_path_factory, samples, channels):
    pcm = np.array(samples, dtype="<i2")
    path = tmp_path_factory.mktemp("wav") / "in.wav"
    path.write_bytes(riff(1, channels, 16_000, 16, np.repeat(pcm, channels).tobytes()))
    assert load_wav_16k(path) == pcm.tobytes()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-32768, 32767), min_size=1, max_size=200))
def test_24_and_32_bit_pcm_and_float32_extensible_read_as_the_same_samples(tmp_path_factory, samples):
    pcm = np.array(samples, dtype="<i2")
    as24 = b"".join(struct.pack("<i", int(s) << 8)[:3] for s in pcm)
    as32 = (pcm.astype("<i4") << 16).tobytes()
    asf32 = (pcm.astype("<f4") / 32768.0).tobytes()
    folder = tmp_path_factory.mktemp("wav")
    for name, blob in [("a.wav", riff(1, 1, 16_000, 24, as24)), ("b.wav", riff(1, 1, 16_000, 32, as32)),
                       ("c.wav", riff(3, 1, 16_000, 32, asf32, extensible=True))]:
        (folder / name).write_bytes(blob)
        assert load_wav_16k(folder / name) == pcm.tobytes(), name


def test_8_bit_pcm_and_the_reported_rate_and_shape(tmp_path):
    path = tmp_path / "u8.wav"
    path.write_bytes(riff(1, 2, 8_000, 8, bytes([128, 0, 255, 128])))
    samples, rate = read_wav(path)
    assert rate == 8_000 and samples.shape == (2, 2)
    assert samples.tolist() == [[0.0, -1.0], [127 / 128, 0.0]]


@pytest.mark.parametrize(
    "blob, message",
    [
        (b"not a wav file at all", "not a RIFF/WAVE file"),
        (b"RIFF\x04\x00\x00\x00WAVE", "no fmt or data chunk"),
        (riff(6, 1, 8_000, 8, b"\x00\x01"), "unsupported WAV encoding (format 6, 8 bits)"),  # A-law
    ],
)
def test_unreadable_wavs_are_rejected_with_a_reason(tmp_path, blob, message):
    path = tmp_path / "bad.wav"
    path.write_bytes(blob)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_wav(path)


def test_a_48k_stereo_float_wav_is_resampled_to_16k_and_still_decodes():
    pcm48 = np.frombuffer(render_speech("resample me", 48_000), dtype="<i2").astype("<f4") / 32768.0
    stereo = np.stack([pcm48, pcm48], axis=1).astype("<f4")
    from vllm_omni_voicechat.audio.wav import to_pcm16_16k

    out = to_pcm16_16k(stereo, 48_000)
    assert abs(len(out) // 2 - len(pcm48) // 3) <= 1
    assert decode_speech(out, 16_000) == "resample me"


# ----------------------------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    "url, expected",
    [
        ("ws://127.0.0.1:8765", "ws://127.0.0.1:8765/v1/voicechat"),
        ("ws://127.0.0.1:8765/", "ws://127.0.0.1:8765/v1/voicechat"),
        ("http://h:1", "ws://h:1/v1/voicechat"),
        ("https://h", "wss://h/v1/voicechat"),
        ("h:9", "ws://h:9/v1/voicechat"),
        ("ws://h:1/v1/realtime?x=1", "ws://h:1/v1/realtime?x=1"),
    ],
)
def test_v3_url_defaults_to_the_strict_route_and_keeps_an_explicit_path(url, expected):
    assert v3_url(url) == expected


def test_turn_timings_from_the_event_log():
    events = [
        {"type": "voicechat.metrics"},
        {"type": "input_audio_buffer.committed", "turn_id": "t2"},  # another turn's
        {"type": "input_audio_buffer.committed", "turn_id": "t1"},
        {"type": "response.created", "response_id": "r0"},  # another response's
        {"type": "response.created", "response_id": "r1", "turn_id": "t1"},
        {"type": "response.output_text.delta", "response_id": "r1"},
        {"type": "response.output_audio.delta", "response_id": "r1"},
        {"type": "response.output_audio.delta", "response_id": "r0"},
        {"type": "response.output_audio.delta", "response_id": "r1"},
        {"type": "response.done", "response_id": "r1"},
    ]
    arrivals = [10.0, 10.001, 10.002, 10.003, 10.05, 10.06, 10.07, 10.08, 10.9, 11.0]
    assert turn_timings(events, arrivals, 10.0, "t1", "r1") == {
        "commit_to_committed_ms": 2.0,
        "commit_to_created_ms": 50.0,
        "ttfa_ms": 70.0,
        "audio_stream_ms": 830.0,
        "commit_to_done_ms": 1000.0,
    }
    assert turn_timings(events[:3], arrivals[:3], 10.0, "t1", None) == {
        "commit_to_committed_ms": 2.0, "commit_to_created_ms": None, "ttfa_ms": None, "audio_stream_ms": None,
        "commit_to_done_ms": None,
    }


def test_inputs_keep_their_command_line_order_across_options():
    args = build_parser().parse_args(
        ["talk", "--say", "one", "--wav", "a.wav", "b.wav", "--text", "two", "--say", "three", "--json"]
    )
    assert args.inputs == [
        TalkInput("say", "one"), TalkInput("wav", "a.wav"), TalkInput("wav", "b.wav"), TalkInput("text", "two"),
        TalkInput("say", "three"),
    ]
    assert [i.source for i in args.inputs] == ["microphone"] * 3 + ["typed", "microphone"]
    assert (args.json, args.paced, args.save_wav, args.url) == (True, True, None, "ws://127.0.0.1:8765/v1/voicechat")


# ----------------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def server():
    with running_server(ServerConfig.simulator(settlement_blank_frames=3)) as url:
        yield url


@pytest.fixture
def wav48k_stereo(tmp_path):
    """Simulator speech at 48 kHz, stereo PCM16: talk must mix it down and resample it."""
    pcm = np.frombuffer(render_speech("hello from a file", 48_000), dtype="<i2")
    path = tmp_path / "question.wav"
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(48_000)
        wav.writeframes(np.repeat(pcm, 2).tobytes())
    return path


def test_talk_json_plays_speech_a_wav_and_typed_text_in_order(server, wav48k_stereo, tmp_path, capsys, monkeypatch):
    from vllm_omni_voicechat.client import talk

    clients = []
    real_talk = talk.talk

    async def spy(*args, **kwargs):  # keeps the session's client (its full event log)
        result = await real_talk(*args, **kwargs)
        clients.append(result.client)
        return result

    monkeypatch.setattr(talk, "talk", spy)
    save = tmp_path / "responses"
    rc = cli_main(["talk", "--url", server, "--say", "hello there", "--wav", str(wav48k_stereo),
                   "--text", "what time is it", "--no-paced", "--json", "--save-wav", str(save)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["url"] == f"{server}/v1/voicechat"
    assert (out["session_status"], out["close_code"]) == ("completed", 1000)
    said = ["hello there", "hello from a file", "what time is it"]
    turns = out["turns"]
    assert [(t["index"], t["kind"], t["source"], t["transcript"], t["text"], t["status"], t["error"]) for t in turns] == [
        (1, "say", "microphone", said[0], f"You said: {said[0]}.", "completed", None),
        (2, "wav", "microphone", said[1], f"You said: {said[1]}.", "completed", None),
        (3, "text", "typed", said[2], f"You said: {said[2]}.", "completed", None),
    ]
    assert turns[1]["input"] == str(wav48k_stereo)
    for t in turns:
        assert t["response_id"] and t["turn_id"] and t["audio_s"] > 0
        # Ordering the contract guarantees: committed strictly before response.created, audio after it.
        assert 0 < t["commit_to_created_ms"] <= t["ttfa_ms"] <= t["commit_to_done_ms"]
        assert 0 <= t["audio_stream_ms"] <= t["commit_to_done_ms"]
        if t["source"] == "microphone":
            assert 0 < t["commit_to_committed_ms"] <= t["commit_to_created_ms"]
        else:
            assert t["commit_to_committed_ms"] is None
        assert t["wav"] == str(save / f"response_{t['index']:02d}.wav")
        with wave.open(t["wav"], "rb") as wav:
            assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 22_050)
            pcm = wav.readframes(wav.getnframes())
        assert len(pcm) == round(t["audio_s"] * 22_050) * 2
        assert decode_speech(pcm, 22_050) == t["text"]
    [client] = clients
    types = [e["type"] for e in client.events]
    assert types.count("response.done") == 3 and types[-1] == "session.closed"
    assert [s.type for s in client.sent if s.type != "input_audio_buffer.append"] == [
        "session.update",
        "input_audio_buffer.turn_start", "input_audio_buffer.commit",
        "input_audio_buffer.turn_start", "input_audio_buffer.commit",
        "input_text.request",
        "session.stop",
    ]


def test_talk_text_report(server, capsys):
    rc = cli_main(["talk", "--url", server, "--say", "hi", "--text", "bye", "--no-paced"])
    lines = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert lines[0].startswith("session ") and lines[0].endswith(f" at {server}/v1/voicechat")
    assert lines[1:4] == [
        "[1] say 'hi'",
        "    user (microphone): hi",
        "    assistant: You said: hi.  [completed: post_eos_audio_silence]",
    ]
    assert lines[4].startswith("    commit->committed ") and " | commit->response.created " in lines[4]
    assert " | TTFA " in lines[4] and " s audio in " in lines[4]
    assert lines[5:8] == [
        "[2] text 'bye'",
        "    user (typed): bye",
        "    assistant: You said: bye.  [completed: post_eos_audio_silence]",
    ]
    assert lines[8].startswith("    request->response.created ") and "commit->committed" not in lines[8]
    assert lines[9:] == ["session completed, close code 1000"]


def test_talk_exit_codes_for_bad_usage_a_bad_wav_and_no_server(tmp_path, capsys):
    assert cli_main(["talk", "--url", "ws://127.0.0.1:1"]) == 2
    assert "give at least one --wav, --say or --text" in capsys.readouterr().err
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"nope")
    assert cli_main(["talk", "--url", f"ws://127.0.0.1:{free_port()}", "--wav", str(bad)]) == 2
    assert "not a RIFF/WAVE file" in capsys.readouterr().err  # refused before connecting
    assert cli_main(["talk", "--url", f"ws://127.0.0.1:{free_port()}", "--text", "hi"]) == 2
    assert "cannot reach ws://127.0.0.1:" in capsys.readouterr().err


def test_the_console_entry_point_has_the_talk_subcommand():
    done = subprocess.run([sys.executable, "-m", "vllm_omni_voicechat.cli", "talk", "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0
    for option in ("--url", "--wav", "--say", "--text", "--save-wav", "--json", "--no-paced"):
        assert option in done.stdout
