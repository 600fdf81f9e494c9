"""One wire response (pure): its state, the dicts that render it (the ``response`` body, its message item, the
terminal's ``status_details``) and what history keeps of it (docs/tiered-dialect.md §3, §5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...audio.frames import FRAME_MS
from .audio import OutputEncoder
from .ledger import PlaybackLedger
from .parser import error_class

# §3.6: GA status_details.reason is a closed set; the full lane keeps our own reasons.
_GA_CANCEL_REASON = {"client_cancelled": "client_cancelled"}


@dataclass(slots=True)
class WireResponse:
    id: str
    native_id: str
    epoch: int
    modalities: tuple[str, ...]
    ledger: PlaybackLedger
    encoder: OutputEncoder | None
    output: list[dict] = field(default_factory=list)
    message_open: bool = False
    held: list[bytes] | None = None
    """OpenAI lane: the response's leading silent audio, held until it speaks (text or audible audio) so a response
    that only calls a function carries no message of silence (``None``: the message is open or was never held)."""
    transcript: str = ""
    text_pending: str = ""
    speak_sent: bool = False
    sent_bytes: int = 0
    done: bool = False
    status: str = "in_progress"
    superseded: bool = False
    """A later user turn was committed after it ended: playback acks for it change nothing."""
    input_audio_tokens: int = 0
    """Usage: positions that heard client audio since the previous response opened (one token = 80 ms)."""
    text_tokens: int = 0
    """Usage: the model's text tokens in this response (one per text delta)."""
    metadata: dict[str, str] | None = None
    """The client's ``response.metadata`` (OpenAI lane), echoed on ``response.created`` and ``response.done``."""

    def usage(self) -> dict[str, Any]:
        """OpenAI's ``response.usage`` in this model's units: a token is one 80 ms position of audio (in: heard,
        out: sent) or one text token of the model; nothing is cached."""
        audio_out = -(-self.ledger.sent_ms // FRAME_MS)
        out = audio_out + self.text_tokens
        return {"total_tokens": self.input_audio_tokens + out, "input_tokens": self.input_audio_tokens,
                "output_tokens": out,
                "input_token_details": {"text_tokens": 0, "audio_tokens": self.input_audio_tokens,
                                        "cached_tokens": 0},
                "output_token_details": {"text_tokens": self.text_tokens, "audio_tokens": audio_out}}

    @property
    def item_id(self) -> str:
        return f"item_{self.id}"

    @property
    def audio(self) -> bool:
        return "audio" in self.modalities

    def content(self, transcript: str) -> list[dict]:
        """The assistant message's one content part (the history keeps it re-cut to what was heard)."""
        return ([{"type": "output_audio", "transcript": transcript}] if self.audio
                else [{"type": "output_text", "text": transcript}])

    def message_item(self, status: str, transcript: str) -> dict:
        content = self.content(transcript)
        return {"id": self.item_id, "type": "message", "object": "realtime.item", "role": "assistant",
                "status": status, "content": content if transcript or status != "in_progress" else []}

    def body(self, session_id: str, *, tier3: bool) -> dict:
        metadata: dict[str, Any]
        if tier3:
            metadata = {"session_id": session_id, "epoch": self.epoch, "playback": self.ledger.snapshot(),
                        "committed": self.ledger.committed_ms >= self.ledger.sent_ms}
        elif self.metadata is not None:
            metadata = dict(self.metadata)  # what the client asked for (LiveKit matches its reply by it)
        else:
            metadata = {"epoch": str(self.epoch)}  # GA metadata values are strings
        return {"id": self.id, "object": "realtime.response", "status": "in_progress", "status_details": None,
                "output": [], "modalities": list(self.modalities), "output_modalities": list(self.modalities),
                "metadata": metadata}

    def done_body(self, session_id: str, reason: str | None, *, tier3: bool) -> dict:
        """The ``response`` of its ``response.done``: the body with its final status and output."""
        body = self.body(session_id, tier3=tier3)
        body["status"] = self.status
        body["status_details"] = status_details(self.status, reason, tier3=tier3)
        body["output"] = list(self.output)
        body["usage"] = self.usage()
        return body

    def history_text(self) -> str:
        """What history keeps: all of it when committed in full, else the prefix heard by committed_ms."""
        ledger = self.ledger
        if ledger.committed_ms >= ledger.sent_ms and ledger.hard_cap is None and self.status != "cancelled":
            return self.transcript
        return self.transcript[: ledger.text_chars_at(ledger.committed_ms)]


def status_details(status: str, reason: str | None, *, tier3: bool) -> dict | None:
    if status == "completed":
        return None
    if status == "failed":
        return {"type": "failed", "error": {"type": error_class(reason or "internal_error"),
                                            "code": reason or "internal_error"}}
    if tier3:
        return {"type": "cancelled", "reason": reason}
    return {"type": "cancelled", "reason": _GA_CANCEL_REASON.get(reason or "", "turn_detected")}
