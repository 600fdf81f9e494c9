"""The benchmark workload (``bench/workload.py``): session scripts -> exact 80 ms PCM16 frames at 16 kHz."""

from __future__ import annotations

import json
import wave
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.bench.workload import (
    DEFAULT_SCRIPTS,
    TurnSource,
    load_scripts,
    parse_script,
    pick_scripts,
    read_wav_16k,
    script_frames,
    split_frames,
    turn_frames,
)


def write_wav(path, samples: np.ndarray, rate: int, channels: int = 1) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.astype("<i2").tobytes())


def test_parse_script_one_turn_per_line_wav_by_prefix_or_suffix(tmp_path):
    script = f"hello there\n\n  wav:{tmp_path}/a.wav  \n{tmp_path}/B.WAV\nwav: ~/c.wav\n"
    assert parse_script(script) == [
        TurnSource(text="hello there"),
        TurnSource(wav=tmp_path / "a.wav"),
        TurnSource(wav=tmp_path / "B.WAV"),
        TurnSource(wav=(tmp_path / "x").home() / "c.wav"),
    ]
    assert parse_script("hi")[0].label == "hi"
    assert TurnSource(wav=tmp_path / "a.wav").label == f"wav:{tmp_path}/a.wav"


@pytest.mark.parametrize("script", ["", "\n  \n"])
def test_an_empty_script_is_refused(script):
    with pytest.raises(ValueError, match="at least one"):
        parse_script(script)


@given(st.binary(max_size=6 * INPUT_FRAME_BYTES).map(lambda b: b[: len(b) // 2 * 2]))
def test_split_frames_is_exact_frames_zero_padded(pcm):
    frames = split_frames(pcm)
    assert all(len(f) == INPUT_FRAME_BYTES for f in frames)
    assert len(frames) == -(-len(pcm) // INPUT_FRAME_BYTES)
    joined = b"".join(frames)
    assert joined[: len(pcm)] == pcm and joined[len(pcm):] == bytes(len(joined) - len(pcm))


def test_split_frames_refuses_odd_bytes():
    with pytest.raises(ValueError, match="even"):
        split_frames(b"\x00")


def test_text_turn_is_simulator_speech_the_decoder_reads_back():
    frames = turn_frames(TurnSource(text="hello there"))
    assert b"".join(frames) == render_speech("hello there") + bytes(len(frames) * INPUT_FRAME_BYTES - 11 * 640)
    assert decode_speech(b"".join(frames), 16000) == "hello there"


def test_wav_turn_is_mixed_down_and_resampled_to_16k(tmp_path):
    t = np.arange(8000) / 8000.0  # 1 s at 8 kHz, stereo: left tone, right silence
    left = np.round(np.sin(2 * np.pi * 440 * t) * 8000)
    write_wav(tmp_path / "s.wav", np.stack([left, np.zeros_like(left)], axis=1).reshape(-1), 8000, channels=2)
    pcm = read_wav_16k(tmp_path / "s.wav")
    x = np.frombuffer(pcm, dtype="<i2")
    assert len(x) == 16000
    assert 3500 < np.abs(x[1000:15000]).max() <= 4001  # the stereo mean halves the tone
    assert len(turn_frames(TurnSource(wav=tmp_path / "s.wav"))) == 13  # 12.5 frames, padded


def test_wav_at_16k_mono_is_passed_through(tmp_path):
    samples = np.arange(-1280, 1280, dtype=np.int64)
    write_wav(tmp_path / "m.wav", samples, 16000)
    assert read_wav_16k(tmp_path / "m.wav") == samples.astype("<i2").tobytes()


def test_non_16_bit_wav_is_refused(tmp_path):
    with wave.open(str(tmp_path / "u8.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(16000)
        w.writeframes(bytes(100))
    with pytest.raises(ValueError, match="16-bit"):
        read_wav_16k(tmp_path / "u8.wav")


def test_script_frames_keeps_turn_order(tmp_path):
    write_wav(tmp_path / "a.wav", np.full(1280 * 2, 1000), 16000)
    turns = script_frames(f"good morning\nwav:{tmp_path}/a.wav")
    assert [t.label for t, _ in turns] == ["good morning", f"wav:{tmp_path}/a.wav"]
    assert [len(f) for _, f in turns] == [len(split_frames(render_speech("good morning"))), 2]


def test_load_scripts_reads_custom_dataset_jsonl_without_pandas(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "a\nb", "output_tokens": 3}) + "\n\n" + json.dumps({"prompt": "c"}) + "\n")
    assert load_scripts(path) == ["a\nb", "c"]
    assert load_scripts(None) == list(DEFAULT_SCRIPTS)


@pytest.mark.parametrize("body, match", [
    ("", "no prompts"),
    ('{"text": "x"}\n', "string 'prompt'"),
    ('["x"]\n', "string 'prompt'"),
    ('{"prompt": "  "}\n', "at least one"),
])
def test_load_scripts_refuses_bad_files(tmp_path, body, match):
    path = tmp_path / "p.jsonl"
    path.write_text(body)
    with pytest.raises(ValueError, match=match):
        load_scripts(path)


@given(st.lists(st.text(min_size=1, max_size=3), min_size=1, max_size=6), st.integers(-1, 20), st.integers(0, 9))
def test_pick_scripts_round_robin_over_a_seeded_order(scripts, count, seed):
    picked = pick_scripts(scripts, count, seed=seed)
    assert picked == pick_scripts(scripts, count, seed=seed)
    n = len(scripts) if count <= 0 else count
    assert len(picked) == n
    cycle = Counter(picked[: len(scripts)])
    assert cycle == Counter(scripts) if n >= len(scripts) else not cycle - Counter(scripts)  # a permutation
    assert all(picked[i] == picked[i % len(scripts)] for i in range(n))
    assert pick_scripts(scripts, count, shuffle=False) == [scripts[i % len(scripts)] for i in range(n)]
