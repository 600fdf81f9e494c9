"""Typed-input synthesizers."""

from __future__ import annotations

import builtins

import numpy as np
import pytest

from vllm_omni_voicechat.audio.speech import decode_speech
from vllm_omni_voicechat.synth import PocketSynthesizer, SimulatorSynthesizer, Synthesizer, SynthesizerUnavailable
from vllm_omni_voicechat.synth.pocket import to_pcm16_16k


def test_simulator_synthesizer_is_instant_deterministic_simulator_speech():
    s = SimulatorSynthesizer()
    assert isinstance(s, Synthesizer) and s.ready
    pcm = s.synthesize("Hello world")
    assert pcm == s.synthesize("Hello world")
    assert decode_speech(pcm, 16_000) == "Hello world"


def test_pocket_is_unavailable_with_a_clear_error_when_the_package_is_missing(monkeypatch):
    real_import = builtins.__import__

    def no_pocket(name, *args, **kwargs):
        if name == "pocket_tts":
            raise ImportError("No module named 'pocket_tts'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pocket)
    p = PocketSynthesizer()
    assert not p.ready
    with pytest.raises(SynthesizerUnavailable, match="pocket-tts is not installed"):
        p.load()
    with pytest.raises(SynthesizerUnavailable, match="pocket-tts is not installed"):
        p.synthesize("hi")


def test_pocket_output_is_resampled_to_16k_pcm16():
    t = np.arange(24_000) / 24_000
    tone = 0.5 * np.sin(2 * np.pi * 440 * t).astype(np.float32)
    pcm = to_pcm16_16k(tone, 24_000)
    assert len(pcm) == 2 * 16_000
    x = np.frombuffer(pcm, "<i2")
    assert 0.45 * 32767 < np.abs(x[2000:-2000]).max() < 0.55 * 32767
