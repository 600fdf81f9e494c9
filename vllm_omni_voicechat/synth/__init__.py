"""Typed-input synthesizers: text -> 16 kHz PCM16 speech fed through the same RNNT path as the microphone."""

from .port import Synthesizer, SynthesizerUnavailable
from .pocket import PocketSynthesizer
from .simulated import SimulatorSynthesizer

__all__ = ["PocketSynthesizer", "SimulatorSynthesizer", "Synthesizer", "SynthesizerUnavailable"]
