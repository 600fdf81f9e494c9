"""Client commands: what a wire parser hands the session core, already shape-checked for its dialect."""

from __future__ import annotations

from dataclasses import dataclass

from ..model.port import SessionPrompt


class Command:
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Configure(Command):
    """Apply a prompt (instructions + tools); acknowledged by ``SessionConfigured`` after prefill."""

    prompt: SessionPrompt
    client_event_id: str | None = None


@dataclass(frozen=True, slots=True)
class AppendAudio(Command):
    """Decoded PCM16 mono 16 kHz microphone audio (any length, whole samples)."""

    pcm: bytes
    client_event_id: str | None = None


@dataclass(frozen=True, slots=True)
class StartTurn(Command):
    client_turn_id: int
    client_event_id: str


@dataclass(frozen=True, slots=True)
class CommitTurn(Command):
    client_turn_id: int
    client_event_id: str


@dataclass(frozen=True, slots=True)
class RequestTypedInput(Command):
    job_id: object
    text: object
    client_event_id: str | None = None


@dataclass(frozen=True, slots=True)
class Stop(Command):
    client_event_id: str | None = None
