"""Native events -> tiered wire events (pure; docs/tiered-dialect.md §3, §4, §5, §9.1).

One native response may become two wire responses: a function call ends wire response A (so OpenAI clients see it
finish and answer the call), and the post-tool speech opens wire response B. Wire ids (``resp_<n>``, items
``item_<response>``) are the projector's own. Cancels run synchronously here: the cancelled terminal goes out at
once, the native response is fenced, and the epoch advances; the core's cancel tail is never shown.

Every wire dict of a response, an item or a playback acknowledgement is rendered here or, for one response's body
and message item, by its ``WireResponse`` (``response.py``); session-level events are ``session_events.py``'s
builders. Events come out as dicts without ``event_id``/``server_event_seq``; the session stamps and journals
them. Tier 3 events are produced only when ``tier3`` is set (the full lane).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pybase64

from ...audio.frames import OUTPUT_SAMPLE_RATE, dbfs
from ...session import events as ev
from ...session.settlement import SILENT_AUDIO_DBFS
from .audio import OutputEncoder
from .epoch import EpochFence
from .items import ItemStore
from .ledger import PlaybackLedger
from .parser import PlaybackAck
from .response import WireResponse
from .session_events import error_event, turn_event

WireEvent = dict[str, Any]

_MS_PER_POSITION = 80


def function_item_id(call_id: str, kind: str = "fc") -> str:
    """The OpenAI lane's id of a call's item (``fc``) or its output's (``fco``): within 32 characters."""
    return f"{kind}_{call_id.removeprefix('call_')}"


@dataclass(frozen=True, slots=True)
class Refused:
    """A client request the projected state cannot serve: the error to answer with."""

    code: str
    message: str
    param: str | None = None


class TieredProjector:
    def __init__(
        self,
        session_id: str,
        *,
        tier3: bool,
        output_format: str = "pcm16",
        output_rate: int = 24_000,
        modalities: tuple[str, ...] = ("audio", "text"),
        commit_policy: str = "commit_all_on_done",
    ) -> None:
        self.session_id = session_id
        self.tier3 = tier3
        self.output_format = output_format
        self.output_rate = output_rate
        self.modalities = modalities
        self.commit_policy = commit_policy
        self.overlap_policy = "listen_only"
        self.fence = EpochFence()
        self.items = ItemStore()
        self.responses: dict[str, WireResponse] = {}
        self.active: WireResponse | None = None
        self.last: WireResponse | None = None
        self.input_ms = 0
        """Milliseconds of microphone audio received so far (speech event timestamps)."""
        self._response_seq = 0
        self._heard_positions = 0  # positions that heard client audio since the last response opened (its usage)
        self._waiting_calls: set[str] = set()  # native responses inside a function cycle (output dropped)
        self._user_turn_item: dict[str, str] = {}
        self.pending_create = False
        """A ``response.create`` after a function output waits for wire response B."""
        self.next_metadata: dict[str, str] | None = None
        """The metadata of a ``response.create`` (OpenAI lane) for the next response to open: echoed on it."""
        self._encoder: OutputEncoder | None = None
        self._encoder_key: tuple[str, int] | None = None

    @property
    def epoch(self) -> int:
        return self.fence.epoch

    def configure(self, *, output_format: str, output_rate: int, modalities: tuple[str, ...], commit_policy: str,
                  overlap_policy: str) -> None:
        """The session's settings changed (responses already open keep theirs)."""
        self.output_format, self.output_rate = output_format, output_rate
        self.modalities, self.commit_policy = modalities, commit_policy
        self.overlap_policy = overlap_policy

    def heard(self, input_ms: int) -> None:
        """The model has heard ``input_ms`` of microphone audio (speech events are stamped with it)."""
        self.input_ms = input_ms

    def session_state(self) -> dict:
        """The live part of the ``session`` object (§1.3)."""
        active = self.active
        return {"state": "open", "turn_state": self.turn_state, "epoch": self.epoch, "turn_id": 0,
                "active_request_id": None, "active_response_id": active.id if active else None,
                "active_response_turn_id": None,
                "playback": (self.last.ledger.snapshot() if self.last else
                             {"generated_ms": 0, "sent_ms": 0, "played_ms": 0, "committed_ms": 0})}

    # ================================================================ native events

    def project(self, e: ev.NativeEvent) -> list[WireEvent]:  # noqa: C901 - one branch per event type
        if type(e) is ev.PositionMetrics:
            if e.frame is not None and e.input_audio:
                self._heard_positions += 1
            return []
        if not self.fence.admits(e):
            return []
        match e:
            case ev.SpeechStarted(source="microphone"):
                out = [{"type": "input_audio_buffer.speech_started", "audio_start_ms": self.input_ms,
                        "item_id": self._user_item(e.turn_id)}]
                if self.active is not None and self.tier3:
                    if self.overlap_policy == "barge_in_on_speech":
                        out.append(self._overlap("barge_in", "speech_during_response"))
                    else:
                        out.append(self._overlap("listen", "model_owned_overlap"))
                return out
            case ev.TranscriptDelta(source="microphone"):
                return [{"type": "conversation.item.input_audio_transcription.delta",
                         "item_id": self._user_item(e.turn_id), "content_index": 0, "delta": e.delta}]
            case ev.SpeechStopped(source="microphone"):
                return [{"type": "input_audio_buffer.speech_stopped", "audio_end_ms": self.input_ms,
                         "item_id": self._user_item(e.turn_id)}]
            case ev.TranscriptCompleted(source="microphone") if e.transcript:
                return self._user_audio_committed(e)
            case ev.ListenDecision():
                return [self.listen(e.reason, model_listen=e.reason == "model_listen")] if self.tier3 else []
            case ev.ResponseCreated():
                return self._open(e.response_id)
            case ev.TextDelta():
                return self._text(e)
            case ev.AudioDelta():
                return self._audio(e)
            case ev.ResponseDone():
                return self._native_done(e)
            case ev.FunctionCallPublished():
                return self._function_call(e)
            case ev.FunctionOutputApplied():
                self._waiting_calls.clear()
                if not self.tier3:
                    return []
                return [turn_event(self.session_id, "function_call_output.applied", self.turn_state, self.epoch,
                                   call_id=e.call_id)]
            case ev.FunctionCallFailed():
                self._waiting_calls.discard(e.response_id)
                return [error_event("function_call_output_timeout",
                                    f"no function_call_output for {e.call_id} in time; the model was told so")]
            case ev.TypedRejected():
                return [error_event(e.reason, f"typed input {e.job_id!r} was not accepted: {e.reason}")]
            case ev.Error():
                return [error_event(e.code, e.message, event_id=e.client_event_id,
                                    retryable=False if e.fatal else None)]
            case _:
                return []

    @property
    def turn_state(self) -> str:
        if self.active is not None:
            return "speaking"
        return "listening"

    # ================================================================ user items

    def _user_item(self, turn_id: str) -> str:
        item = self._user_turn_item.get(turn_id)
        if item is None:
            # the OpenAI lane keeps ids within 32 characters (turn ids carry the session id)
            item = f"item_{turn_id}" if self.tier3 else f"item_u{len(self._user_turn_item) + 1}"
            self._user_turn_item[turn_id] = item
        return item

    def _user_audio_committed(self, e: ev.TranscriptCompleted) -> list[WireEvent]:
        item_id = self._user_item(e.turn_id)
        for r in self.responses.values():
            r.superseded = r.superseded or r.done
        item = {"id": item_id, "type": "message", "object": "realtime.item", "role": "user", "status": "completed",
                "content": [{"type": "input_audio", "transcript": e.transcript}]}
        previous = self.items.add(item)
        committed: WireEvent = {"type": "input_audio_buffer.committed", "previous_item_id": previous,
                                "item_id": item_id}
        if self.tier3:
            committed["event"] = {"type": "input.committed", "session_id": self.session_id, "turn_id": e.turn_id,
                                  "epoch": self.epoch, "history_len": len(self.items), "message": e.transcript,
                                  "realtime_item_id": item_id}
        seconds = round(self.input_ms / 1000, 3)
        return [
            *self.item_added(item, previous),
            committed,
            {"type": "conversation.item.input_audio_transcription.completed", "item_id": item_id, "content_index": 0,
             "transcript": e.transcript, "usage": {"type": "duration", "seconds": seconds}},
            {"type": "conversation.item.done", "previous_item_id": previous, "item": item},
        ]

    def item_added(self, item: dict, previous: str | None) -> list[WireEvent]:
        # The seed emits the beta and GA spellings together.
        return [{"type": "conversation.item.added", "previous_item_id": previous, "item": item},
                {"type": "conversation.item.created", "previous_item_id": previous, "item": item}]

    # ================================================================ responses

    def _open(self, native_id: str) -> list[WireEvent]:
        if self.active is not None:  # defensive: one wire response at a time
            return []
        self._response_seq += 1
        rid = f"resp_{self._response_seq}"
        encoder = self._output_encoder() if "audio" in self.modalities else None
        r = WireResponse(rid, native_id, self.epoch, self.modalities,
                         PlaybackLedger(rid, self.commit_policy), encoder)  # type: ignore[arg-type]
        r.input_audio_tokens, self._heard_positions = self._heard_positions, 0
        r.metadata, self.next_metadata = self.next_metadata, None
        self.responses[rid] = r
        self.active = self.last = r
        self.pending_create = False
        body = r.body(self.session_id, tier3=self.tier3)
        out = [{"type": "response.created", "response_id": rid, "response": body}]
        if self.tier3 or not r.audio:
            out += self._open_message(r)
        else:
            r.held = []  # the OpenAI lane opens the message when the response first speaks
        return out

    def _speak_held(self, r: WireResponse) -> list[WireEvent]:
        """The held response speaks: its message opens and the held silence goes out first."""
        held, r.held = r.held or [], None
        out = self._open_message(r)
        assert r.encoder is not None
        for pcm in held:
            r.ledger.generated(len(pcm) * 1000 // (2 * OUTPUT_SAMPLE_RATE))
            out += self._audio_chunk(r, r.encoder.feed(pcm))
        return out

    def _output_encoder(self) -> OutputEncoder:
        """The session's resampler, shared by its responses (one open at a time; each terminal drains it): a
        resampler per response cost a soxr init each and kept C memory alive as long as the response's record."""
        key = (self.output_format, self.output_rate)
        if self._encoder is None or self._encoder_key != key:
            self._encoder, self._encoder_key = OutputEncoder(*key), key
        return self._encoder

    def _open_message(self, r: WireResponse) -> list[WireEvent]:
        r.message_open = True
        item = r.message_item("in_progress", "")
        previous = self.items.add(item)
        part = {"type": "audio", "transcript": ""} if r.audio else {"type": "text", "text": ""}
        return [
            *self.item_added(item, previous),
            {"type": "response.output_item.added", "response_id": r.id, "output_index": len(r.output), "item": item},
            {"type": "response.content_part.added", "response_id": r.id, "item_id": r.item_id,
             "output_index": len(r.output), "content_index": 0, "part": part},
        ]

    def _wire_for(self, native_id: str) -> list[WireEvent] | WireResponse | None:
        """The open wire response of a native one; opens response B after a function cycle."""
        if native_id in self._waiting_calls:
            return None
        r = self.active
        if r is not None and r.native_id == native_id:
            return r
        if r is None and self.last is not None and self.last.native_id == native_id:
            return self._open(native_id)  # post-tool speech: wire response B
        return None

    def _delivering(self, native_id: str) -> tuple[list[WireEvent], WireResponse | None]:
        """The wire response a delta goes to, with the events that opened it (response B)."""
        opened = self._wire_for(native_id)
        if isinstance(opened, list):
            return opened, self.active
        return [], opened

    def _text(self, e: ev.TextDelta) -> list[WireEvent]:
        out, r = self._delivering(e.response_id)
        if r is None:
            return out
        r.text_tokens += 1
        if r.audio:
            r.text_pending += e.delta  # paired with the next non-empty audio delta
            return out
        r.transcript += e.delta
        out.append({"type": "response.output_text.delta", "response_id": r.id, "item_id": r.item_id,
                    "output_index": len(r.output), "content_index": 0, "delta": e.delta})
        return out

    def _audio(self, e: ev.AudioDelta) -> list[WireEvent]:
        out, r = self._delivering(e.response_id)
        if r is None or r.encoder is None:
            return out
        if r.held is not None:
            if not r.text_pending and dbfs(e.pcm) <= SILENT_AUDIO_DBFS:
                r.held.append(e.pcm)  # nothing said yet: a function call may come first
                return out
            out += self._speak_held(r)
        r.ledger.generated(len(e.pcm) * 1000 // (2 * OUTPUT_SAMPLE_RATE))
        out += self._audio_chunk(r, r.encoder.feed(e.pcm))
        return out

    def _audio_chunk(self, r: WireResponse, data: bytes) -> list[WireEvent]:
        if not data:
            return []
        assert r.encoder is not None
        out: list[WireEvent] = []
        if not r.speak_sent:
            r.speak_sent = True
            if self.tier3:
                out.append({"type": "response.speak", "response_id": r.id, "item_id": r.item_id, "output_index": 0,
                            "content_index": 0,
                            "metadata": {"session_id": self.session_id, "epoch": r.epoch, "model_speak": True}})
        delta, r.text_pending = r.text_pending, ""
        r.transcript += delta
        r.sent_bytes += len(data)
        ms = round(r.sent_bytes * 1000 / r.encoder.bytes_per_second) - r.ledger.sent_ms  # no rounding drift
        r.ledger.sent(ms, len(r.transcript))
        addr = {"response_id": r.id, "item_id": r.item_id, "output_index": len(r.output), "content_index": 0}
        out.append({
            "type": "response.output_audio.delta", **addr, "delta": pybase64.b64encode(data).decode("ascii"),
            "format": r.encoder.format, "sample_rate_hz": r.encoder.sample_rate,
            "metadata": {"session_id": self.session_id, "epoch": r.epoch, "model_speak": True, "end_of_turn": False,
                         "audio_duration_ms": r.ledger.sent_ms,
                         "audio_text_marks": [{"text_chars": len(r.transcript), "audio_end_ms": r.ledger.sent_ms}],
                         "playback": r.ledger.snapshot()},
        })
        out.append({"type": "response.output_audio_transcript.delta", **addr, "delta": delta})
        return out

    def _close_message(self, r: WireResponse, status: str) -> list[WireEvent]:
        """Flush audio, then the done events of the message item (``status`` completed | incomplete)."""
        out: list[WireEvent] = []
        if r.encoder is not None:
            out += self._audio_chunk(r, r.encoder.flush())
        if r.text_pending:  # text the model spoke after its last audible chunk
            r.transcript += r.text_pending
            r.text_pending = ""
        r.message_open = False
        addr = {"response_id": r.id, "item_id": r.item_id, "output_index": len(r.output), "content_index": 0}
        heard = r.history_text() if status != "completed" else r.transcript
        if r.audio:
            out += [
                {"type": "response.output_audio.done", **addr},
                {"type": "response.output_audio_transcript.done", **addr, "transcript": r.transcript},
                {"type": "response.content_part.done", **addr, "part": {"type": "audio", "transcript": heard}},
            ]
        else:
            out += [
                {"type": "response.output_text.done", **addr, "text": r.transcript},
                {"type": "response.content_part.done", **addr, "part": {"type": "text", "text": heard}},
            ]
        item = r.message_item(status, heard)
        self.items.add(item)
        previous = self.items.previous_of(r.item_id)
        r.output.append(item)
        out += [
            {"type": "response.output_item.done", "response_id": r.id, "output_index": len(r.output) - 1,
             "item": item},
            {"type": "conversation.item.done", "previous_item_id": previous, "item": item},
        ]
        return out

    def _terminal(self, r: WireResponse, status: str, reason: str | None) -> list[WireEvent]:
        out: list[WireEvent] = []
        r.status = status
        if status == "failed" and r.encoder is not None:
            r.encoder.clear()  # after a fatal error nothing but terminals goes out: the resampler tail is dropped
        if r.held is not None and (r.held or r.text_pending) and status == "completed":
            out += self._speak_held(r)  # it completed without a word: its audio, as before (a cancel drops it)
        r.held = None
        if r.message_open:  # flushes the resampler: sent_ms is final only after it
            out += self._close_message(r, "completed" if status == "completed" else "incomplete")
        r.ledger.finish(status == "completed")
        r.encoder = None  # drained above; the next response takes the session's resampler
        r.done = True
        r.status = status
        if self.active is r:
            self.active = None
        body = r.done_body(self.session_id, reason, tier3=self.tier3)
        return out + [{"type": "response.done", "response_id": r.id, "response": body},
                      {"type": "rate_limits.updated", "rate_limits": []}]

    def _native_done(self, e: ev.ResponseDone) -> list[WireEvent]:
        self._waiting_calls.discard(e.response_id)
        r = self.active
        if r is None or r.native_id != e.response_id:
            return []  # wire response A already ended at its function call and B never opened
        out = self._terminal(r, e.status, e.reason)
        if e.status == "cancelled":
            self.fence.advance(e.response_id)  # a core-initiated cancel (a new turn) also starts an epoch
        return out

    def _function_call(self, e: ev.FunctionCallPublished) -> list[WireEvent]:
        out: list[WireEvent] = []
        r = self.active
        if r is None or r.native_id != e.response_id:
            out += self._open(e.response_id)
            r = self.active
        assert r is not None
        if r.message_open:
            out += self._close_message(r, "completed")
        r.held = None  # the silence before the call: no message at all
        index = len(r.output)
        item_id = f"item_fc_{e.call_id}" if self.tier3 else function_item_id(e.call_id)
        item = {"id": item_id, "type": "function_call", "object": "realtime.item", "status": "in_progress",
                "name": e.name, "call_id": e.call_id, "arguments": ""}
        previous = self.items.add(dict(item))
        done_item = {**item, "status": "completed", "arguments": e.arguments}
        self.items.add(done_item)
        addr = {"response_id": r.id, "item_id": item_id, "output_index": index, "call_id": e.call_id}
        out += [
            {"type": "response.output_item.added", "response_id": r.id, "output_index": index, "item": item},
            *self.item_added(item, previous),
            {"type": "response.function_call_arguments.delta", **addr, "delta": e.arguments},
            {"type": "response.function_call_arguments.done", **addr, "arguments": e.arguments, "name": e.name},
            {"type": "response.output_item.done", "response_id": r.id, "output_index": index, "item": done_item},
            {"type": "conversation.item.done", "previous_item_id": previous, "item": done_item},
        ]
        r.output.append(done_item)
        r.message_open = False
        self._waiting_calls.add(e.response_id)
        out += self._terminal(r, "completed", None)
        return out

    # ================================================================ wire-initiated decisions

    def cancel(self, reason: str, *, clear: bool = False,
               always_advance: bool = False) -> tuple[list[WireEvent], str | None]:
        """End the open wire response as cancelled now and fence its native response.

        Returns the events and the native response id the core must cancel (None when nothing was open; then
        ``always_advance`` still starts a new epoch).
        """
        r = self.active
        if r is None:
            if always_advance:
                self.fence.advance()
            return [], None
        out: list[WireEvent] = []
        if clear:
            out.append({"type": "output_audio_buffer.cleared", "response_id": r.id})
        if r.encoder is not None:
            r.encoder.clear()  # unsent audio of a cancelled response is dropped, not flushed
        out += self._terminal(r, "cancelled", reason)
        self.fence.advance(r.native_id)
        self._waiting_calls.discard(r.native_id)
        return out, r.native_id

    def listen(self, reason: str, *, model_listen: bool = False) -> WireEvent:
        return {"type": "response.listen", "session_id": self.session_id, "epoch": self.epoch,
                "response": {"object": "realtime.response", "status": "listening",
                             "metadata": {"type": "listen", "session_id": self.session_id, "epoch": self.epoch,
                                          "reason": reason, "model_listen": model_listen}}}

    def _overlap(self, action: str, reason: str) -> WireEvent:
        return {"type": "overlap.decision", "session_id": self.session_id, "epoch": self.epoch,
                "policy": self.overlap_policy, "action": action, "reason": reason, "metadata": {}}

    # ================================================================ history and playback

    def refresh_history(self, r: WireResponse) -> None:
        """Re-cut the stored assistant item after an ack or a truncation."""
        if r.done and r.item_id in self.items:
            stored = self.items.get(r.item_id)
            if stored is not None and stored.get("type") == "message":
                self.items.update(r.item_id, content=r.content(r.history_text()))

    def response_for_item(self, item_id: str) -> WireResponse | None:
        if item_id.startswith("item_resp_"):
            return self.responses.get(item_id[len("item_"):])
        return None

    # ================================================================ client requests on the projected state

    def item(self, item_id: str) -> dict | None:
        """A copy of a history item (``conversation.item.retrieve``)."""
        return self.items.get(item_id)

    def delete_item(self, item_id: str) -> bool:
        """Drop an item from the client's view of the history (the model keeps its own context)."""
        return self.items.delete(item_id)

    def add_client_item(self, item_id: str, role: Any, content: list, size: int) -> list[WireEvent]:
        """A client ``message`` item joins the history (the model heard nothing of it); ``size``: its content's JSON
        bytes, counted against the history's budget for client items."""
        stored = {"id": item_id, "type": "message", "object": "realtime.item", "role": role, "status": "completed",
                  "content": content}
        previous = self.items.add(stored, client_bytes=max(1, size))
        return [*self.item_added(stored, previous),
                {"type": "conversation.item.done", "previous_item_id": previous, "item": stored}]

    def add_function_output(self, item_id: str, call_id: str, output: str) -> list[WireEvent]:
        """A function result joins the history; the ``response.create`` openai-agents sends next is answered by
        the post-tool response B."""
        stored = {"id": item_id, "type": "function_call_output", "object": "realtime.item", "call_id": call_id,
                  "output": output, "status": "completed"}
        previous = self.items.add(stored)
        self.pending_create = True
        return [*self.item_added(stored, previous),
                {"type": "conversation.item.done", "previous_item_id": previous, "item": stored}]

    def truncate(self, item_id: str, content_index: int, audio_end_ms: float) -> list[WireEvent] | Refused:
        if item_id not in self.items:
            return Refused("item_not_found", f"no item {item_id!r}", "item_id")
        r = self.response_for_item(item_id)
        if r is None:
            return Refused("bad_event", "only assistant audio items can be truncated", "item_id")
        end = r.ledger.truncate(audio_end_ms)
        self.refresh_history(r)
        event: WireEvent = {"type": "conversation.item.truncated", "item_id": item_id, "content_index": content_index,
                            "audio_end_ms": end}
        if self.tier3:
            event["event"] = {"type": "conversation.item.truncate", "item_id": item_id,
                              "requested_audio_end_ms": audio_end_ms, "audio_end_ms": end}
        return [event]

    def clear_output(self) -> list[WireEvent]:
        """``output_audio_buffer.clear`` with no response open: what the last one did not play is dropped (a new
        epoch when there was any)."""
        last = self.last
        if last is None and not self.tier3:
            return []  # nothing was ever played; GA's cleared event needs a response id
        out: WireEvent = {"type": "output_audio_buffer.cleared", "response_id": last.id if last else None}
        if last is not None and last.ledger.unplayed:
            last.ledger.truncate(last.ledger.committed_ms)
            self.refresh_history(last)
            self.fence.advance()
        return [out]

    def playback_ack(self, e: PlaybackAck) -> list[WireEvent] | Refused:
        """What the client has played (§5): the target response's ledger, and its history cut, move on."""
        if e.item_id is not None and e.response_id is not None and e.item_id != f"item_{e.response_id}":
            return Refused("playback_item_mismatch", "item_id does not belong to response_id", "item_id")
        rid = e.response_id
        if rid is None and e.item_id is not None:
            r0 = self.response_for_item(e.item_id)
            rid = r0.id if r0 else None
            if rid is None:
                return Refused("playback_item_not_found", f"no response item {e.item_id!r}", "item_id")
        if rid is None:
            pending = [r for r in self.responses.values() if r.ledger.unplayed]
            target = pending[0] if len(pending) == 1 else (self.active or self.last)
        else:
            target = self.responses.get(rid)
        if target is None:
            return Refused("playback_item_not_found", f"no response {rid!r}", "response_id")
        stale = target.status == "cancelled" or target.superseded or (target.done and target.epoch != self.epoch)
        before = target.history_text()
        if not stale:
            target.ledger.ack(e.played_ms, e.committed_ms, truncate=bool(e.truncate))
            self.refresh_history(target)
        if not self.tier3:
            return []
        event = {"type": "playback.acknowledged", "session_id": self.session_id, "epoch": self.epoch,
                 "response_id": target.id, "item_id": target.item_id, "played_ms": target.ledger.played_ms,
                 "committed_ms": target.ledger.committed_ms, "truncate": bool(e.truncate),
                 "playback": target.ledger.snapshot(),
                 "history_committed": not stale and (target.done or target.history_text() != before)}
        if stale:
            event["stale"] = True
        return [{"type": "playback.acknowledged", "event": event}]
