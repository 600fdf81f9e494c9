"""What goes out of a tiered session, in order: every event gets its ``event_id``; the OpenAI lane never sees a
Tier 3 event; ``session.created`` comes first (§1.3: what a client event raised during the first prefill is held);
transport-level events carry no seq (§3.7); every other event gets its ``server_event_seq`` from the resume journal
(the full lane) or from the lane's own counter."""

from __future__ import annotations

import itertools
from typing import Any

from ..transport import WireText, compact_json, server_json
from .journal import Journal
from .session_events import resync_required

WireEvent = dict[str, Any]

# Not journaled: they carry or precede the attachment's own credential (§3.7).
TRANSPORT_LEVEL = frozenset({"session.created", "session.resumed", "session.replaced", "session.resync_required"})
# What may precede session.created (everything else raised during the first prefill waits for it).
SERVER_MADE = frozenset({"response.output_audio.delta", "response.output_audio_transcript.delta",
                         "response.output_text.delta", "conversation.item.input_audio_transcription.delta"})
"""The per-position events, made only of the server's values (no echoed client id): the fast JSON path."""
BEFORE_CREATED = frozenset({"error", "session.closed", "session.expired", "session.resync_required"})
TIER3 = frozenset({
    "session.heartbeat_ack", "session.closed", "session.resumed", "session.replaced", "session.expired",
    "session.resync_required", "response.speak", "response.listen", "duplex.function_call.done",
    "playback.acknowledged", "overlap.decision", "turn.event",
})


class Stamping:
    def __init__(self, session_id: str, *, tier3: bool, journal: Journal | None) -> None:
        self.session_id = session_id
        self.tier3 = tier3
        self.journal = journal
        self.created = False
        """``session.created`` went out: session events flow."""
        self._ids = itertools.count(1)
        self._seq = 0  # the OpenAI lane's seq counter (no journal)
        self._held: list[WireEvent] = []

    def next_id(self) -> int:
        """The next number of the session's one counter (event ids, generated item ids)."""
        return next(self._ids)

    def stamp(self, event: WireEvent) -> WireEvent:
        stamped = {"type": event["type"], "event_id": f"event_{self.next_id()}"}
        stamped.update(event)  # type and event_id stay first (an existing key keeps its place)
        return stamped

    def transport(self, event: WireEvent) -> WireText:
        """A transport-level event: stamped, never journaled, no seq."""
        return WireText(compact_json(self.stamp(event)))

    def send(self, events: list[WireEvent], now: float) -> list[WireText]:
        out: list[WireText] = []
        for event in events:
            if not self.tier3 and event["type"] in TIER3:
                continue
            if not self.created and event["type"] not in BEFORE_CREATED:
                self._held.append(event)
                continue
            event = self.stamp(event)
            if event["type"] in TRANSPORT_LEVEL:
                out.append(WireText(compact_json(event)))
                continue
            encode = server_json if event["type"] in SERVER_MADE else compact_json
            if self.journal is not None:
                recorded = self.journal.record(event, now, encode=encode)
                if recorded.overflow_notice:
                    out.append(self.transport(resync_required(self.session_id, "journal_overflow")))
                out.append(WireText(recorded.text, recorded.seq))
            else:
                self._seq += 1
                out.append(WireText(encode({**event, "server_event_seq": self._seq}), self._seq))
        return out

    def release_held(self, now: float) -> list[WireText]:
        """``session.created`` went out: what waited for it follows."""
        held, self._held = self._held, []
        return self.send(held, now)
