"""The input audio buffer of a tiered session (pure): client audio converted to the core's 16 kHz PCM16, what was
appended since the last commit, and the input held until the first prefill is done (OpenAI clients do not wait for
readiness), which then runs in order. It also keeps the receipt a resuming client reads to resend exactly the
audio a drop lost (``input_received`` in ``session.resumed``, docs/tiered-dialect.md §6.5)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...session.commands import AppendAudio
from .audio import AudioFormatError, InputConverter
from .projector import Refused

if TYPE_CHECKING:
    from .parser import InputAudioBufferAppend
    from .settings import SessionSettings


class InputBuffer:
    def __init__(self, format: Any, sample_rate: Any, max_held_bytes: int) -> None:
        self.converter = InputConverter(format, sample_rate)
        self.uncommitted = 0
        """Client audio bytes appended since the last commit or clear."""
        self.max_held_bytes = max_held_bytes
        self._held: list[Any] = []
        self._held_bytes = 0  # the held audio's PCM (other held commands are not counted)
        self.accepted_bytes = 0
        """Client audio bytes taken into the session's input, over its whole life (commits and clears included)."""
        self.accepted_appends = 0
        self.last_append_event_id: Any = None
        """The ``event_id`` of the last audio append handled (taken in or answered with an error), or None."""

    def append(self, e: InputAudioBufferAppend, settings: SessionSettings, *,
               held: bool, arrived: float | None = None) -> AppendAudio | Refused | None:
        """The core's command for an append (``held``: before the first prefill, it waits, and its audio is late only
        from when it is let through; ``arrived``: when the host read it); None when nothing goes to the core now."""
        if e.audio is None:
            return None  # video frames only: accepted and ignored
        self.last_append_event_id = e.event_id
        fmt = e.format or settings.input_format
        rate = e.sample_rate_hz or settings.input_rate
        try:
            if (fmt, rate) != (self.converter.format, self.converter.sample_rate):
                self.converter = InputConverter(fmt, rate)
            pcm = self.converter.feed(e.audio)
        except AudioFormatError as exc:
            return Refused(exc.code, str(exc), exc.param)
        if held and pcm and self._held_bytes + len(pcm) > self.max_held_bytes:
            return Refused("input_backpressure", "too much audio before the session was ready")
        self.uncommitted += len(e.audio)
        self.accepted_bytes += len(e.audio)
        self.accepted_appends += 1
        if not pcm:
            return None
        if not held:
            return AppendAudio(pcm, e.event_id, len(e.audio), arrived)
        command = AppendAudio(pcm, e.event_id, len(e.audio))
        self._held.append(command)
        self._held_bytes += len(pcm)
        return None

    def receipt(self) -> dict[str, Any]:
        """What a resuming client reads to resend exactly the rest of its audio (``session.resumed``)."""
        return {"audio_bytes": self.accepted_bytes, "appends": self.accepted_appends,
                "last_append_event_id": self.last_append_event_id}

    def hold(self, command: Any) -> None:
        """A command that waits for the first prefill behind the input held before it."""
        self._held.append(command)

    def take_held(self) -> list[Any]:
        """The first prefill is done: what waited for it, in order."""
        held, self._held, self._held_bytes = self._held, [], 0
        return held

    def commit(self) -> bytes:
        """A commit: the converter's tail (``b""`` when none)."""
        self.uncommitted = 0
        return self.converter.flush()

    def drop(self) -> None:
        """The uncommitted audio is dropped (a commit of no speech)."""
        self.uncommitted = 0
        self.converter.clear()

    def clear(self) -> None:
        """``input_audio_buffer.clear``: the uncommitted audio and everything held are dropped."""
        self.drop()
        self._held.clear()
        self._held_bytes = 0
