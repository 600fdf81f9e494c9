"""Simulator speech codec: exact text round trips, streaming pieces, resampling, real-speech placeholders."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import soxr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.audio.speech import (
    SPEECH_THRESHOLD_DBFS,
    DecodeStep,
    SpeechDecoder,
    decode_speech,
    is_speech_energy,
    render_speech,
    render_token_audio,
)
from vllm_omni_voicechat.model.tokens import split_tokens

IN_SR = 16_000
OUT_SR = 22_050
OUT_FRAME = 1_764
IN_FRAME_BYTES = 2 * 1_280

FIXED_TEXTS = [
    "Hello world",
    'You said: call get_weather {"city": "Paris"}.',
    "naïve café ✓",
    "0123456789 +-*/=<>()[]{}!?.,;:'\"@#$%^&_|~`\\",
    " leading space",
    "trailing space ",
    "multiple   spaces  inside",
    "   ",
    "x",
    "Grüße aus Köln – 東京 𝄞 €",
    "tab\tand\nnewline",
]

_UNICODE = "éïüñçß€✓–中文東京𝄞😀"
text_strategy = st.text(
    alphabet=st.one_of(st.characters(min_codepoint=32, max_codepoint=126), st.sampled_from(_UNICODE)),
    max_size=40,
)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- helpers --------------------------------------------------------------------------------------------


def to_pcm(x: np.ndarray) -> bytes:
    return np.clip(np.round(np.asarray(x) * 32767.0), -32768, 32767).astype("<i2").tobytes()


def to_float(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0


def resample(pcm: bytes, src: int, dst: int) -> bytes:
    return to_pcm(soxr.resample(to_float(pcm), src, dst))


def silence(seconds: float, sr: int) -> bytes:
    return bytes(2 * int(round(seconds * sr)))


def stream(pcm: bytes, sr: int, chunk_samples: list[int] | int) -> tuple[list[str], list[DecodeStep]]:
    """Feed ``pcm`` in chunks (cycling through ``chunk_samples``), then flush; return pieces and steps."""
    sizes = [chunk_samples] if isinstance(chunk_samples, int) else chunk_samples
    dec = SpeechDecoder(sr)
    steps = []
    i = k = 0
    while i < len(pcm):
        n = 2 * sizes[k % len(sizes)]
        steps.append(dec.feed(pcm[i : i + n]))
        i += n
        k += 1
    steps.append(dec.flush())
    return [p for s in steps for p in s.pieces], steps


def word_pieces(text: str) -> list[str]:
    """The expected streaming pieces: the text cut before every space."""
    return [p for p in re.split(r"(?= )", text) if p]


def band_noise(seconds: float, sr: int, seed: int = 0, dbfs: float = -20.0) -> np.ndarray:
    n = int(round(seconds * sr))
    rng = np.random.default_rng(seed)
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.fft.rfftfreq(n, 1.0 / sr)
    spec[(f < 300.0) | (f > 3400.0)] = 0.0
    x = np.fft.irfft(spec, n)
    return x * (10 ** (dbfs / 20.0) / np.sqrt(np.mean(x * x)))


def vowel(seconds: float, sr: int, dbfs: float = -20.0) -> np.ndarray:
    n = int(round(seconds * sr))
    t = np.arange(n) / sr
    f0 = 120.0 + 15.0 * np.sin(2 * np.pi * 3.0 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    formants = (700.0, 1200.0, 2600.0)
    x = np.zeros(n)
    for k in range(1, 30):
        gain = sum(1.0 / (1.0 + ((k * 120.0 - fm) / 150.0) ** 2) for fm in formants) + 0.05
        x += gain * np.sin(k * phase + 0.3 * k * k)
    return x * (10 ** (dbfs / 20.0) / np.sqrt(np.mean(x * x)))


def chirp(seconds: float, sr: int, dbfs: float = -20.0) -> np.ndarray:
    t = np.arange(int(round(seconds * sr))) / sr
    x = np.sin(2 * np.pi * (200.0 * t + 1500.0 * t * t))
    return x * (10 ** (dbfs / 20.0) / np.sqrt(np.mean(x * x)))


def token_stream(text: str, silent_after: list[bool] | None = None) -> bytes:
    frames = []
    for i, tok in enumerate(split_tokens(text)):
        frame = render_token_audio(tok)
        assert len(frame) == 2 * OUT_FRAME
        frames.append(frame)
        if silent_after and silent_after[i % len(silent_after)]:
            frames.append(bytes(2 * OUT_FRAME))
    return b"".join(frames)


# --- rendering ------------------------------------------------------------------------------------------


def test_render_layout():
    assert render_speech("") == b""
    assert len(render_speech("abc", 16_000)) == 2 * 3 * 320
    assert len(render_speech("abc", 22_050)) == 2 * 3 * 441
    assert len(render_speech("é", 16_000)) == 2 * 2 * 320  # two UTF-8 bytes, two symbols
    x = np.frombuffer(render_speech("a", 16_000), dtype="<i2")
    assert np.all(x[240:] == 0)  # 15 ms tone then 5 ms of digital silence
    assert 0.5 * 32767 < np.abs(x).max() <= 0.61 * 32767  # two tones of 0.3 full scale
    assert render_speech("Hi") == render_speech("Hi", 16_000)  # deterministic


def test_render_token_audio_layout_and_limits():
    four = render_token_audio(" hel")
    assert len(four) == 2 * OUT_FRAME
    assert four == render_speech(" hel", OUT_SR)  # 4 symbols fill the frame exactly
    one = render_token_audio("a")
    assert one == render_speech("a", OUT_SR) + bytes(2 * (OUT_FRAME - 441))
    assert render_token_audio("") == bytes(2 * OUT_FRAME)
    assert len(render_token_audio("ab", sample_rate=24_000, frame_samples=1_920)) == 2 * 1_920
    with pytest.raises(ValueError):
        render_token_audio("hello")
    with pytest.raises(ValueError):
        render_token_audio("✓✓")  # 6 bytes
    with pytest.raises(ValueError):
        render_speech("a", 8_000)


def test_split_tokens_example():
    assert split_tokens("You said: hello there.") == ["You", " sai", "d:", " hel", "lo", " the", "re."]
    assert split_tokens("") == []
    assert split_tokens("𝄞𝄞") == ["𝄞", "𝄞"]
    assert split_tokens("ab      c") == ["ab", "    ", "  c"]
    assert split_tokens("ab c", max_bytes=8) == ["ab", " c"]
    with pytest.raises(ValueError):
        split_tokens("é", max_bytes=1)


@SETTINGS
@given(text=text_strategy, max_bytes=st.integers(4, 8))
def test_split_tokens_property(text, max_bytes):
    tokens = split_tokens(text, max_bytes)
    assert "".join(tokens) == text
    assert all(0 < len(t.encode("utf-8")) <= max_bytes for t in tokens)
    assert split_tokens(text, max_bytes) == tokens
    # a token begins where a word begins (at the run of spaces after the previous word)
    boundaries = set(np.cumsum([0] + [len(t) for t in tokens]).tolist())
    for i in range(1, len(text)):
        if text[i] == " " and text[i - 1] != " ":
            assert i in boundaries


# --- exact round trips ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", FIXED_TEXTS)
@pytest.mark.parametrize("sr", [16_000, 22_050, 24_000])
def test_fixed_round_trip(text, sr):
    pcm = render_speech(text, sr)
    assert decode_speech(pcm, sr) == text
    assert decode_speech(silence(0.3, sr) + pcm + silence(1.7, sr), sr) == text


@pytest.mark.parametrize("text", FIXED_TEXTS)
def test_fixed_streaming_pieces(text):
    pcm = silence(0.05, IN_SR) + render_speech(text, IN_SR) + silence(0.2, IN_SR)
    for chunks in (1_280, 1, [3, 700, 17, 1_280, 5_000], 10**6):
        pieces, _ = stream(pcm, IN_SR, chunks)
        assert pieces == word_pieces(text)


def test_hello_world_word_by_word_frame_by_frame():
    pcm = render_speech("Hello world", IN_SR) + silence(0.16, IN_SR)
    dec = SpeechDecoder(IN_SR)
    seen = []
    for i in range(0, len(pcm), IN_FRAME_BYTES):
        step = dec.feed(pcm[i : i + IN_FRAME_BYTES])
        seen.extend(step.pieces)
    assert seen == ["Hello", " world"]  # the last word is emitted by the end-of-utterance silence
    assert dec.flush().pieces == ()


def test_end_of_utterance_needs_40ms_of_silence():
    dec = SpeechDecoder(IN_SR)
    # the rendering ends with a 5 ms gap; 20 ms more is still inside the word
    assert dec.feed(render_speech("Hello", IN_SR)).pieces == ()
    assert dec.feed(silence(0.02, IN_SR)).pieces == ()
    assert dec.feed(silence(0.03, IN_SR)).pieces == ("Hello",)


def test_flush_emits_pending_and_reset_clears():
    dec = SpeechDecoder(IN_SR)
    step = dec.feed(render_speech("one two", IN_SR))
    assert step.pieces == ("one",) and step.energetic
    assert dec.flush().pieces == (" two",)
    assert dec.flush().pieces == ()
    dec.feed(render_speech("abc", IN_SR)[:3000])  # stop mid-symbol
    dec.reset()
    assert dec.feed(render_speech("xyz", IN_SR)).pieces == ()
    assert dec.flush().pieces == ("xyz",)


def test_odd_byte_chunks():
    pcm = render_speech("odd chunks", IN_SR)
    pieces, _ = stream(b"", IN_SR, 1)
    assert pieces == []
    dec = SpeechDecoder(IN_SR)
    out = []
    for i in range(0, len(pcm), 333):  # odd byte lengths: a sample may straddle two chunks
        out.extend(dec.feed(pcm[i : i + 333]).pieces)
    out.extend(dec.flush().pieces)
    assert "".join(out) == "odd chunks"


def test_decode_step_is_frozen():
    step = SpeechDecoder().feed(silence(0.08, IN_SR))
    assert step == DecodeStep((), False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.energetic = True  # type: ignore[misc]


@SETTINGS
@given(text=text_strategy)
def test_property_round_trip_whole(text):
    assert decode_speech(render_speech(text, IN_SR), IN_SR) == text


@SETTINGS
@given(
    text=text_strategy,
    chunks=st.lists(st.integers(1, 3_000), min_size=1, max_size=8),
    lead=st.integers(0, 8_000),
)
def test_property_streaming_random_chunks(text, chunks, lead):
    pcm = bytes(2 * lead) + render_speech(text, IN_SR) + silence(0.1, IN_SR)
    pieces, steps = stream(pcm, IN_SR, chunks)
    assert "".join(pieces) == text
    for i, piece in enumerate(pieces):
        if i > 0 or text.startswith(" "):
            assert piece.startswith(" ")
    assert pieces == word_pieces(text)
    assert any(s.energetic for s in steps) == bool(text)


# --- model output tokens and resampling ------------------------------------------------------------------


@pytest.mark.parametrize("text", FIXED_TEXTS[:4])
def test_token_frames_decode_after_resampling(text):
    pcm = token_stream(text, silent_after=[False, True, False, False, True, True])
    assert decode_speech(pcm, OUT_SR) == text
    assert decode_speech(resample(pcm, OUT_SR, 24_000), 24_000) == text
    assert decode_speech(resample(pcm, OUT_SR, 16_000), 16_000) == text


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=text_strategy, gaps=st.lists(st.booleans(), min_size=1, max_size=6))
def test_property_token_frames_resampled(text, gaps):
    pcm = token_stream(text, gaps)
    assert decode_speech(pcm, OUT_SR) == text
    for sr in (24_000, 16_000):
        res = resample(pcm, OUT_SR, sr)
        assert decode_speech(res, sr) == text
        pieces, _ = stream(res, sr, 1_280)
        assert "".join(pieces) == text


def test_noise_and_long_silences():
    rng = np.random.default_rng(7)
    text = 'call get_weather {"city": "Paris"}'
    for sr in (IN_SR, OUT_SR):
        speech = to_float(render_speech(text, sr))
        x = np.concatenate([np.zeros(int(2.3 * sr)), speech, np.zeros(int(3.1 * sr))])
        x += rng.standard_normal(x.size) * 10 ** (-60 / 20)
        pcm = to_pcm(x)
        assert decode_speech(pcm, sr) == text
        pieces, _ = stream(pcm, sr, [1_000, 1_764, 4_321])
        assert "".join(pieces) == text


# --- real speech, silence, mixtures ----------------------------------------------------------------------


@pytest.mark.parametrize("make", [band_noise, vowel, chirp])
@pytest.mark.parametrize("sr", [IN_SR, OUT_SR])
def test_real_speech_placeholder(make, sr):
    pcm = silence(0.3, sr) + to_pcm(make(1.2, sr)) + silence(0.3, sr)
    assert decode_speech(pcm, sr) == "[speech 1.2 s]"
    pieces, steps = stream(pcm, sr, int(0.08 * sr))
    assert pieces == ["[speech 1.2 s]"]
    assert any(s.energetic for s in steps)
    assert is_speech_energy(pcm, sr)


def test_real_speech_placeholder_waits_for_80ms_of_silence():
    dec = SpeechDecoder(IN_SR)
    steps = [dec.feed(to_pcm(band_noise(1.2, IN_SR)))]
    assert steps[0].pieces == () and steps[0].energetic
    step = dec.feed(silence(0.07, IN_SR))
    assert step == DecodeStep((), False)
    assert dec.feed(silence(0.02, IN_SR)).pieces == ("[speech 1.2 s]",)


def test_energetic_is_about_the_chunk_itself():
    dec = SpeechDecoder(IN_SR)
    loud = bytes([0x00, 0x40] * 1_280)  # one 80 ms frame of constant 0x4000
    first = dec.feed(loud)
    assert first.energetic and first.pieces == ()
    # silence is measured on the 2 ms envelope: the region is reported once the envelope has been below
    # the threshold for 80 ms, i.e. in the second silent frame
    assert dec.feed(silence(0.08, IN_SR)) == DecodeStep((), False)
    assert dec.feed(silence(0.08, IN_SR)) == DecodeStep(("[speech 0.1 s]",), False)
    dec = SpeechDecoder(IN_SR)
    steps = [dec.feed(f) for f in (silence(0.08, IN_SR), loud[:10], loud[10:], silence(0.001, IN_SR))]
    assert [s.energetic for s in steps] == [False, True, True, False]


def test_real_speech_short_gaps_merge_long_gaps_split():
    sr = IN_SR
    merged = to_pcm(band_noise(0.5, sr, 1)) + silence(0.05, sr) + to_pcm(band_noise(0.65, sr, 2))
    assert decode_speech(merged, sr) == "[speech 1.2 s]"
    split = to_pcm(band_noise(0.5, sr, 1)) + silence(0.2, sr) + to_pcm(band_noise(0.6, sr, 2))
    assert decode_speech(split, sr) == "[speech 0.5 s] [speech 0.6 s]"


def test_silence_is_empty_and_not_energetic():
    for sr in (IN_SR, OUT_SR, 24_000):
        pcm = silence(1.0, sr)
        assert decode_speech(pcm, sr) == ""
        pieces, steps = stream(pcm, sr, 1_280)
        assert pieces == [] and not any(s.energetic for s in steps)
        assert not is_speech_energy(pcm, sr)
    rng = np.random.default_rng(3)
    quiet = to_pcm(rng.standard_normal(IN_SR) * 10 ** (-60 / 20))
    assert decode_speech(quiet, IN_SR) == ""
    assert not SpeechDecoder(IN_SR).feed(quiet).energetic
    assert not is_speech_energy(quiet, IN_SR)
    assert is_speech_energy(render_speech("a", IN_SR), IN_SR)
    assert -45 <= SPEECH_THRESHOLD_DBFS <= -35


def test_mixed_sim_then_real_then_sim():
    sr = IN_SR
    pcm = (
        render_speech("Hello there", sr)
        + silence(0.2, sr)
        + to_pcm(vowel(1.2, sr))
        + silence(0.2, sr)
        + render_speech("bye", sr)
    )
    assert decode_speech(pcm, sr) == "Hello there [speech 1.2 s] bye"
    pieces, _ = stream(pcm, sr, 1_280)
    assert pieces == ["Hello", " there", " [speech 1.2 s]", " bye"]


def test_mixed_without_silence_between_keeps_order():
    sr = IN_SR
    # real speech right after text, and text starting 20 ms after real speech (no 80 ms gap)
    pcm = render_speech("hi", sr) + to_pcm(chirp(0.7, sr)) + silence(0.02, sr) + render_speech("ok ", sr)
    assert decode_speech(pcm, sr) == "hi [speech 0.7 s] ok "
    pcm2 = render_speech("hi ", sr) + silence(0.2, sr) + to_pcm(band_noise(0.4, sr))
    assert decode_speech(pcm2, sr) == "hi [speech 0.4 s]"


def test_mixed_token_frames_and_real_speech_at_output_rate():
    text = "You said: hello there."
    pcm = token_stream(text, [False, True]) + to_pcm(band_noise(1.2, OUT_SR)) + silence(0.5, OUT_SR)
    assert decode_speech(pcm, OUT_SR) == text + " [speech 1.2 s]"
    res = resample(pcm, OUT_SR, 24_000)
    assert decode_speech(res, 24_000) == text + " [speech 1.2 s]"


def test_wrong_tones_are_real_speech():
    sr = IN_SR
    # a single 15 ms tone (one nibble group only) shaped like a symbol is not a symbol
    t = np.arange(240) / sr
    burst = 0.3 * np.sin(2 * np.pi * 1_000 * t) * np.hanning(240)
    pcm = silence(0.1, sr) + to_pcm(burst) + silence(0.2, sr)
    out = decode_speech(pcm, sr)
    assert out.startswith("[speech ") and out.endswith(" s]")


# --- the quiet-chunk fast path -----------------------------------------------------------------------------

_THRESHOLD_AMPLITUDE = 32768.0 * 10.0 ** (-40.0 / 20.0)  # -40 dBFS: ~328


def _segment(kind: str, seconds: float, level: float, text: str, seed: int) -> bytes:
    n = int(seconds * IN_SR)
    rng = np.random.default_rng(seed)
    if kind == "speech":
        pcm = np.frombuffer(render_speech(text or "a", IN_SR), "<i2").astype(np.float64)
        return np.clip(np.round(pcm * level), -32768, 32767).astype("<i2").tobytes()
    if kind == "noise":  # around the threshold: some windows reach it, most do not
        return np.clip(np.round(rng.normal(0.0, level * _THRESHOLD_AMPLITUDE, n)), -32768, 32767).astype("<i2").tobytes()
    if kind == "square":  # constant level around the threshold: every window of it is on, or none
        x = np.full(n, int(level * _THRESHOLD_AMPLITUDE), dtype="<i2")
        x[1::2] *= -1
        return x.tobytes()
    if kind == "click":  # one loud sample in silence: a window reaches the threshold at once
        x = np.zeros(n, dtype="<i2")
        x[rng.integers(0, n)] = int(min(32767, level * 4 * _THRESHOLD_AMPLITUDE))
        return x.tobytes()
    return bytes(2 * n)


def _decode_steps(pcm: bytes, chunks: list[int], fast: bool) -> list[tuple]:
    decoder = SpeechDecoder(IN_SR)
    decoder.quiet_fast_path = fast
    steps, i, k = [], 0, 0
    while i < len(pcm):
        size = chunks[k % len(chunks)]
        k += 1
        step = decoder.feed(pcm[i : i + size])
        steps.append((step.pieces, step.energetic))
        i += size
    steps.append((decoder.flush().pieces, None))
    return steps


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    segments=st.lists(
        st.tuples(st.sampled_from(["speech", "noise", "square", "click", "zero"]), st.floats(0.005, 0.3),
                  st.floats(0.05, 2.0), st.text("ab c", max_size=4), st.integers(0, 1000)),
        min_size=1, max_size=8),
    chunks=st.lists(st.integers(1, 4_000), min_size=1, max_size=6),
)
def test_property_quiet_fast_path_changes_nothing(segments, chunks):
    """Chunks below the threshold skip the envelope; every piece and every ``energetic`` is as without it, for any
    mix of speech, noise near the threshold, lone loud samples and silence, in any chunking."""
    pcm = b"".join(_segment(*s) for s in segments)
    assert _decode_steps(pcm, chunks, fast=True) == _decode_steps(pcm, chunks, fast=False)


def test_quiet_fast_path_is_taken_for_quiet_frames_only():
    decoder = SpeechDecoder(IN_SR)
    calls = []
    real = decoder._quiet_chunk
    decoder._quiet_chunk = lambda *a: calls.append(1) or real(*a)
    quiet = np.full(1_280, int(_THRESHOLD_AMPLITUDE / 2), dtype="<i2").tobytes()  # -46 dBFS: below
    decoder.feed(quiet)
    assert calls == [1]
    decoder.feed(render_speech("hi", IN_SR)[:2_560])
    assert calls == [1]  # speech is processed in full


def test_digital_silence_skips_even_the_quiet_check():
    """All-zero frames (pauses, synthetic positions) after an "off" window: no envelope, no level check, and the
    same steps as the full path, also when the silence follows a word and ends it."""
    decoder = SpeechDecoder(IN_SR)
    calls = []
    real_silent, real_quiet = decoder._silence, decoder._quiet
    decoder._silence = lambda *a: calls.append("silent") or real_silent(*a)
    decoder._quiet = lambda *a: calls.append("quiet") or real_quiet(*a)
    decoder.feed(bytes(2_560))
    assert calls == ["silent"]
    pcm = render_speech("hi there", IN_SR) + bytes(2_560 * 12)
    chunks = [2_560]
    assert _decode_steps(pcm, chunks, fast=True) == _decode_steps(pcm, chunks, fast=False)
    assert "".join(p for pieces, _ in _decode_steps(pcm, chunks, fast=True) for p in pieces) == "hi there"


def test_quiet_fast_path_counts_the_previous_chunks_tail():
    """A window straddling two chunks: a loud last sample (its own window is off) plus a next chunk just below
    the threshold is on, though neither chunk's own level says so."""
    t = _THRESHOLD_AMPLITUDE
    first = np.zeros(1_280, dtype="<i2")
    first[-1] = int(5 * t)  # 25 t^2 < 32 t^2 (env_len 32 at 16 kHz): off
    second = np.full(1_280, int(0.9 * t), dtype="<i2")  # 32 * 0.81 t^2 < 32 t^2: off alone
    steps = {fast: _decode_steps(first.tobytes() + second.tobytes(), [2_560], fast) for fast in (True, False)}
    assert [piece for pieces, _ in steps[False] for piece in pieces] == ["[speech 0.0 s]"]  # the windows were on
    assert steps[True] == steps[False]
