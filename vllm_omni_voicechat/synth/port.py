"""The typed-input synthesizer port."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..errors import VoicechatError


class SynthesizerUnavailable(VoicechatError, RuntimeError):
    """The synthesizer (or its package or weights) cannot be used here."""


@runtime_checkable
class Synthesizer(Protocol):
    name: str

    @property
    def ready(self) -> bool:
        """True once the synthesizer can serve requests (``capabilities.typed_input``)."""

    def synthesize(self, text: str) -> bytes:
        """Render ``text`` as PCM16 mono 16 kHz speech. Blocking; called off the event loop."""
