"""Audio conversion of the tiered dialect (docs/tiered-dialect.md §8)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.audio.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from vllm_omni_voicechat.audio.speech import decode_speech, render_speech, render_token_audio
from vllm_omni_voicechat.model.tokens import split_tokens
from vllm_omni_voicechat.wire.tiered.audio import (
    AudioFormatError,
    InputConverter,
    OutputEncoder,
    input_sample_rate,
    output_sample_rate,
    resolve_format,
)

RATES = [8000, 16000, 22050, 24000, 44100, 48000]
WIDTH = {"pcm16": 2, "pcm_f32le": 4, "g711_ulaw": 1, "g711_alaw": 1}


def _signal(rate: int, seconds: float = 0.5, seed: int = 0) -> np.ndarray:
    """A float signal in [-0.6, 0.6]: a tone plus a little noise."""
    n = int(round(rate * seconds))
    t = np.arange(n) / rate
    rng = np.random.default_rng(seed)
    return 0.5 * np.sin(2 * np.pi * 440.0 * t) + 0.1 * rng.uniform(-1, 1, n)


def _encode_input(fmt: str, x: np.ndarray) -> bytes:
    i16 = np.round(x * 32767).astype(np.int16)
    if fmt == "pcm16":
        return i16.astype("<i2").tobytes()
    if fmt == "pcm_f32le":
        return x.astype("<f4").tobytes()
    if fmt == "g711_ulaw":
        return ulaw_encode(i16)
    return alaw_encode(i16)


def _convert(conv, data: bytes, chunk_sizes=None) -> bytes:
    if chunk_sizes is None:
        return conv.feed(data) + conv.flush()
    out = []
    pos = 0
    for size in chunk_sizes:
        out.append(conv.feed(data[pos : pos + size]))
        pos += size
    out.append(conv.feed(data[pos:]))
    out.append(conv.flush())
    return b"".join(out)


def _random_chunks(total: int, width: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    sizes, pos = [], 0
    while pos < total:
        size = min(total - pos, width * rng.choice([0, 1, 7, 80, 333, 1280, 4001]))
        sizes.append(size)
        pos += size
    return sizes


# --- input -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("fmt", list(WIDTH))
def test_input_length_and_chunking(fmt, rate):
    data = _encode_input(fmt, _signal(rate))
    n_in = len(data) // WIDTH[fmt]
    whole = _convert(InputConverter(fmt, rate), data)
    assert len(whole) % 2 == 0
    assert abs(len(whole) // 2 - n_in * 16000 / rate) <= 1
    chunked = _convert(InputConverter(fmt, rate), data, _random_chunks(len(data), WIDTH[fmt], seed=rate))
    assert chunked == whole


@pytest.mark.parametrize("fmt", list(WIDTH))
def test_input_level_preserved(fmt):
    """A 440 Hz tone keeps its level through decode and resampling (48 kHz -> 16 kHz)."""
    x = _signal(48000, seed=1)
    out = np.frombuffer(_convert(InputConverter(fmt, 48000), _encode_input(fmt, x)), dtype="<i2") / 32767
    ref_rms = float(np.sqrt(np.mean(x**2)))
    mid = out[len(out) // 4 : -len(out) // 4]
    assert abs(float(np.sqrt(np.mean(mid**2))) - ref_rms) < 0.05 * ref_rms


def test_input_16k_pcm_passthrough():
    data = np.arange(-500, 500, dtype="<i2").tobytes()
    conv = InputConverter("pcm16", 16000)
    assert conv.feed(data) == data
    assert conv.flush() == b""


def test_input_converter_reusable_after_flush():
    data = _encode_input("pcm16", _signal(24000))
    conv = InputConverter("pcm16", 24000)
    first = _convert(conv, data)
    assert _convert(conv, data) == first
    conv.feed(data[:1000])
    conv.clear()
    assert _convert(conv, data) == first


def test_f32_clipping():
    x = np.array([-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.5, np.inf, -np.inf, np.nan], dtype="<f4")
    conv = InputConverter("pcm_f32le", 16000)
    out = np.frombuffer(conv.feed(x.tobytes()), dtype="<i2").tolist()
    assert out == [-32767, -32767, -16384, 0, 16384, 32767, 32767, 32767, -32767, 0]


@pytest.mark.parametrize("fmt,size", [("pcm16", 3), ("pcm_f32le", 6)])
def test_malformed_sizes(fmt, size):
    with pytest.raises(AudioFormatError) as err:
        InputConverter(fmt, 16000).feed(b"\x00" * size)
    assert err.value.code == "bad_event"


@pytest.mark.parametrize("rate", [0, 7999, 192001, 16000.5, "16000", True, None])
def test_bad_rates(rate):
    with pytest.raises(ValueError, match="sample_rate"):
        InputConverter("pcm16", rate)
    with pytest.raises(ValueError, match="sample_rate"):
        OutputEncoder("pcm16", rate if rate is not None else 0)


@pytest.mark.parametrize("fmt", ["wav", "mp3", "", None, 16])
def test_bad_formats(fmt):
    with pytest.raises(ValueError, match="format"):
        InputConverter(fmt, 16000)


def test_f32_not_an_output_format():
    with pytest.raises(AudioFormatError, match="output"):
        OutputEncoder("pcm_f32le")


# --- G.711 -----------------------------------------------------------------------------------------------


def test_g711_known_values():
    assert ulaw_decode(b"\xff\x7f\x00\x80").tolist() == [0, 0, -32124, 32124]
    assert alaw_decode(b"\xd5\x55\x2a\xaa").tolist() == [8, -8, -32256, 32256]
    assert ulaw_encode(np.array([0, -32768, 32767], dtype=np.int16)) == b"\xff\x00\x80"
    assert alaw_encode(np.array([8, -8, -32768, 32767], dtype=np.int16)) == b"\xd5\x55\x2a\xaa"


def test_g711_round_trip():
    codes = bytes(range(256))
    assert alaw_encode(alaw_decode(codes)) == codes
    back = ulaw_encode(ulaw_decode(codes))
    assert [i for i in range(256) if back[i] != i] == [0x7F]  # mu-law -0 encodes as +0 (0xFF)
    x = np.arange(-32768, 32768, dtype=np.int32)
    for enc, dec in ((ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)):
        err = np.abs(dec(enc(x)).astype(np.int32) - x)
        assert err.max() <= 644
        small = np.abs(x) < 256
        assert err[small].max() <= 8  # fine steps near zero


def test_g711_decode_is_monotonic():
    for table in (ulaw_decode(bytes(range(256))), alaw_decode(bytes(range(256)))):
        values = sorted(set(table.tolist()))
        assert len(values) >= 255 and values[0] < -32000 and values[-1] > 32000


# --- format and rate resolution ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value,expected",
    [
        ("pcm16", ("pcm16", None)),
        ("PCM_S16LE", ("pcm16", None)),
        ("s16le", ("pcm16", None)),
        ("pcm", ("pcm16", None)),
        ("audio/pcm", ("pcm16", None)),
        ({"type": "audio/pcm", "rate": 24000}, ("pcm16", 24000)),
        ("f32le", ("pcm_f32le", None)),
        ({"type": "audio/pcm_f32le"}, ("pcm_f32le", None)),
        ("audio/pcmu", ("g711_ulaw", None)),
        ({"type": "audio/pcmu"}, ("g711_ulaw", None)),
        ("mulaw", ("g711_ulaw", None)),
        ("ulaw", ("g711_ulaw", None)),
        ("g711-ulaw", ("g711_ulaw", None)),
        ("audio/g711_ulaw", ("g711_ulaw", None)),
        ("audio/pcma", ("g711_alaw", None)),
        ("alaw", ("g711_alaw", None)),
        ("g711-alaw", ("g711_alaw", None)),
        ("audio/g711_alaw", ("g711_alaw", None)),
    ],
)
def test_resolve_format(value, expected):
    assert resolve_format(value) == expected


def test_input_rate_precedence():
    session = {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "sample_rate_hz": 44100}}}
    assert input_sample_rate({"sample_rate_hz": 8000, "sample_rate": 16000}, session) == 8000
    assert input_sample_rate({"sample_rate": 16000}, session) == 16000
    assert input_sample_rate({"format": {"type": "audio/pcm", "rate": 24000}}, {"sample_rate": 8000}) == 24000
    assert input_sample_rate({}, session) == 44100
    assert input_sample_rate(None, {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}}) == 24000
    assert input_sample_rate(None, {"sample_rate_hz": 48000, "sample_rate": 8000}) == 48000
    assert input_sample_rate() == 16000
    assert input_sample_rate(lane="openai") == 24000
    assert input_sample_rate(lane="openai", format="audio/pcmu") == 8000
    with pytest.raises(AudioFormatError):
        input_sample_rate({"sample_rate_hz": 4000})


def test_output_rate_precedence():
    assert output_sample_rate() == 24000
    assert output_sample_rate(format="g711_alaw") == 8000
    assert output_sample_rate({"sample_rate": 16000}) == 16000
    assert output_sample_rate({"audio": {"output": {"sample_rate_hz": 22050}}, "sample_rate": 16000}) == 22050
    both = {"audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}, "sample_rate_hz": 22050}}}
    assert output_sample_rate(both) == 24000


# --- output -----------------------------------------------------------------------------------------------


def test_output_defaults():
    assert (OutputEncoder().format, OutputEncoder().sample_rate) == ("pcm16", 24000)
    assert OutputEncoder("audio/pcmu").sample_rate == 8000
    assert OutputEncoder({"type": "audio/pcm", "rate": 24000}).sample_rate == 24000


def test_output_22050_to_24000_exact_total():
    frame = render_token_audio("abc")  # 1,764 samples
    enc = OutputEncoder()
    out = b"".join(enc.feed(frame) for _ in range(10)) + enc.flush()
    assert len(out) == 2 * 19200
    # a second response through the same encoder after flush
    assert len(b"".join(enc.feed(frame) for _ in range(10)) + enc.flush()) == 2 * 19200


@pytest.mark.parametrize("fmt,rate", [("pcm16", 22050), ("pcm16", 16000), ("g711_ulaw", 8000), ("g711_alaw", 8000)])
def test_output_other_rates(fmt, rate):
    frame = render_token_audio("xy")
    enc = OutputEncoder(fmt, rate)
    out = b"".join(enc.feed(frame) for _ in range(5)) + enc.flush()
    width = 2 if fmt == "pcm16" else 1
    assert abs(len(out) // width - 5 * 1764 * rate / 22050) <= 1
    if rate == 22050:
        assert out == frame * 5


def test_output_odd_byte_carry():
    frame = render_token_audio("hi")
    whole = OutputEncoder()
    ref = whole.feed(frame) + whole.flush()
    split = OutputEncoder()
    assert split.feed(frame[:101]) + split.feed(frame[101:]) + split.flush() == ref


# --- simulator speech survives the round trips ------------------------------------------------------------

TEXT = "You said: hello there. Ünïcode ok?"


def test_model_output_to_24k_decodes():
    tokens = split_tokens(TEXT)
    enc = OutputEncoder("pcm16", 24000)
    out = b"".join(enc.feed(render_token_audio(tok)) for tok in tokens) + enc.flush()
    assert decode_speech(out, 24000) == TEXT


def test_client_24k_input_to_16k_decodes():
    text = "hello world, call get_weather now"
    audio = render_speech(text, 24000) + b"\x00\x00" * 4800
    conv = InputConverter("pcm16", 24000)
    pcm16k = _convert(conv, audio, _random_chunks(len(audio), 2, seed=7))
    assert decode_speech(pcm16k, 16000) == text


def test_client_f32_48k_input_to_16k_decodes():
    text = "float input"
    pcm = np.frombuffer(render_speech(text, 48000), dtype="<i2").astype("<f4") / 32767
    pcm16k = _convert(InputConverter("audio/pcm_f32le", 48000), pcm.tobytes())
    assert decode_speech(pcm16k, 16000) == text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(width=32), st.floats(-1.5, 1.5, width=32),
                          st.integers(-32768, 32767).map(lambda v: v / 32767 + 0.5 / 32767)), max_size=64))
def test_f32_samples_convert_as_defined(values):
    """NaN -> 0, then clip to [-1, 1], scale by 32767 and round half to even, for any float32 (inf, huge, tiny,
    exact halves between two int16 steps) in one chunk."""
    x = np.asarray(values, dtype="<f4")
    ref = x.astype(np.float64)
    ref[np.isnan(ref)] = 0.0
    expect = np.round(np.clip(ref, -1.0, 1.0) * 32767.0).astype(np.int16).tolist()
    out = np.frombuffer(InputConverter("pcm_f32le", 16000).feed(x.tobytes()), dtype="<i2").tolist()
    assert out == expect


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["pcm16", "pcm_f32le"]), st.integers(0, 40), st.booleans(), st.data())
def test_16k_input_shortcuts_give_what_the_decoder_gives(fmt, samples, silent, data):
    """At the model's rate nothing is resampled: PCM16 passes as it is, float32 silence (zero bytes) becomes zero
    samples without float maths; both exactly what decoding gives."""
    width = 2 if fmt == "pcm16" else 4
    chunk = bytes(samples * width) if silent else data.draw(st.binary(min_size=samples * width,
                                                                        max_size=samples * width))
    conv = InputConverter(fmt, 16000)
    assert conv.feed(chunk) == conv.decode(chunk).astype("<i2").tobytes()
