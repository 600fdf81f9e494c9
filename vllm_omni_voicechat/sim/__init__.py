"""Deterministic CPU simulator of the full-duplex speech model (its speech codec is ``audio/speech.py``)."""

from ..audio.speech import decode_speech, render_speech

__all__ = ["decode_speech", "render_speech"]
