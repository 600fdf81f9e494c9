"""What answers a turn (pure): the ``response.create`` a user text item or a commit holding its EOU waits for, or the
model itself.

OpenAI lane, model-owned turns: the model opens the answer by itself (a ``response.create`` meanwhile is absorbed).
It is due from the turn's commit until its ``response.created``; then that response's wire id is the turn's answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...session import events as ev
from ...session.commands import RequestTypedInput, RespondNow
from .session_events import error_event

if TYPE_CHECKING:
    from .response import WireResponse
    from .settings import SessionSettings

WireEvent = dict[str, Any]

# What the OpenAI lane's turn bookkeeping looks at (``TurnAnswer.hides``).
_TURN_EVENTS = frozenset({ev.SpeechStarted, ev.SpeechStopped, ev.TranscriptDelta, ev.TranscriptCompleted,
                          ev.ListenDecision, ev.FunctionCallPublished})


@dataclass(slots=True)
class TurnAnswer:
    awaiting_create: bool = False
    """A commit holds its EOU until ``response.create`` fires it (client-owned turns, ``auto_response`` false)."""
    due: bool = False
    self_answer: str | None = None
    create_waiting: tuple[Any] | None = None
    """(event id,) of a create whose commit is still settling."""
    staged_text: tuple[str, str] | None = None
    """(item_id, text) of a user text item waiting for ``response.create``."""

    def committed(self, *, respond: bool, openai: bool) -> None:
        self.awaiting_create = not respond
        self.due = respond and openai

    def stage_text(self, item_id: str, role: Any, content: list) -> None:
        """A client message item: a user's (or a system's) text is typed input for the next ``response.create``.
        The model's instructions are its prompt, resident from the first position, so a system message added later
        (Pipecat's appended messages, a framework's per-turn instruction) is heard the way typed text is."""
        texts = [c.get("text") for c in content if isinstance(c, dict) and c.get("type") in ("input_text", "text")]
        if role in ("user", "system", "developer") and any(isinstance(t, str) and t for t in texts):
            self.staged_text = (item_id, " ".join(t for t in texts if isinstance(t, str) and t))

    def create(self, event_id: Any) -> RequestTypedInput | RespondNow | None:
        """A ``response.create``: the staged text's typed input, or the EOU a commit holds (the create waits until
        that commit settles, see ``unheard_commit``); None when it answers neither."""
        if self.staged_text is not None:
            item_id, text = self.staged_text
            self.staged_text = None
            return RequestTypedInput(item_id, text, event_id)
        if not self.awaiting_create:
            return None
        self.awaiting_create = False
        self.create_waiting = (event_id,)
        return RespondNow(event_id)

    def answering(self, active: WireResponse | None, settling: bool) -> bool:
        """The model answers a turn by itself: its answer is due, or open, or the turn is still settling."""
        if self.due:
            return True
        if active is not None and active.id == self.self_answer:
            return True
        return settling

    def hides(self, o: ev.Output, settings: SessionSettings) -> bool:
        """OpenAI lane bookkeeping of who answers a turn; True for events client-owned turns never show: OpenAI
        sends no speech events without turn detection, and the transcript comes with the commit."""
        if type(o) not in _TURN_EVENTS:
            return False
        if isinstance(o, (ev.SpeechStarted, ev.SpeechStopped, ev.TranscriptDelta)):
            return o.source == "microphone" and settings.client_turns
        if isinstance(o, ev.TranscriptCompleted):
            if o.source == "microphone" and o.transcript:
                self.due = settings.model_eou
                self.create_waiting = None
        elif isinstance(o, (ev.ListenDecision, ev.FunctionCallPublished)):
            self.due = False
        return False

    def created(self, active: WireResponse | None) -> None:
        """A ``response.created`` went out (``active``: the wire response it opened)."""
        if self.due and active is not None:
            self.due, self.self_answer = False, active.id
        self.create_waiting = None

    def unheard_commit(self, o: ev.ListenDecision) -> list[WireEvent]:
        """OpenAI lane: a commit whose audio held no speech the model heard ends as a listen decision, which
        the lane cannot show (``response.listen`` is Tier 3). The client is told, and a ``response.create`` already
        sent for it is answered too, instead of waiting for a response that never comes."""
        out = [error_event("input_audio_buffer_empty", "the committed audio holds no speech the model heard; "
                           "nothing was committed", event_id=o.client_event_id)]
        if self.create_waiting is not None:
            out.append(error_event("response_create_without_input", "nothing to respond to: the committed "
                                   "audio held no speech", event_id=self.create_waiting[0]))
        self.awaiting_create = False
        self.create_waiting = None
        return out
