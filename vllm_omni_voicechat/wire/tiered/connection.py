"""One tiered session as a sans-I/O protocol object (docs/tiered-dialect.md §2-§6).

It drives a :class:`~vllm_omni_voicechat.session.core.SessionCore` in the model-owned turn policy with the same
interface as ``V3Session`` (so the asyncio shell hosts it), and adds what outlives a socket: the resume journal,
the rotating credential and the lease (detach grace, idle TTL). Outputs are :class:`Outbound` texts (already
stamped with ``server_event_seq`` where journaled), core effects and :class:`CloseTransport`.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

from ...model.port import SessionPrompt, StepResult
from ...runner.stage0 import Position
from ...session import events as ev
from ...session.commands import (
    AppendAudio,
    CancelResponse,
    ClearInput,
    CommitInput,
    Configure,
    RequestTypedInput,
    RespondNow,
    Stop,
    SubmitFunctionOutput,
)
from ...session.core import SessionCore, Tick
from ..transport import CloseTransport
from . import parser as p
from .audio import AudioFormatError, InputConverter
from .journal import InvalidAck, Journal, Replay, ReplayConflict, ResumeCredential, ResyncRequired, compact_json
from .projector import TieredProjector, WireEvent, error_event
from .schema import CLOSE_NORMAL, DISCONNECT_GRACE_S, MAX_PENDING_INPUT_BYTES, capabilities, close_code_for
from .settings import SessionSettings, SettingsError, apply_update, default_settings, render_session

# Not journaled: they carry or precede the attachment's own credential (§3.7).
_TRANSPORT_LEVEL = frozenset({"session.created", "session.resumed", "session.replaced", "session.resync_required"})
# What may precede session.created (everything else raised during the first prefill waits for it).
_BEFORE_CREATED = frozenset({"error", "session.closed", "session.expired", "session.resync_required"})
_TIER3 = frozenset({
    "session.heartbeat_ack", "session.closed", "session.resumed", "session.replaced", "session.expired",
    "session.resync_required", "response.speak", "response.listen", "duplex.function_call.done",
    "playback.acknowledged", "overlap.decision", "turn.event",
})


@dataclass(frozen=True, slots=True)
class Outbound:
    """One server event as JSON text; ``seq`` is its ``server_event_seq`` (None for transport-level events)."""

    text: str
    seq: int | None = None

    def json(self) -> dict:
        return json.loads(self.text)


@dataclass(frozen=True, slots=True)
class Detached:
    """The transport of attachment ``generation`` went away (None: the current one); fed through the shell so the
    grace deadline is scheduled. Stale once a resume moved the generation on."""

    generation: int | None = None


@dataclass(frozen=True, slots=True)
class TieredOptions:
    lane: str = "full"
    model: str | None = None
    autostart: bool = False
    default_instructions: str = ""
    max_sessions: int = 1
    disconnect_grace_s: float = DISCONNECT_GRACE_S
    journal_max_bytes: int = 8 << 20
    journal_ttl_s: float = 60.0
    max_pending_input_bytes: int = MAX_PENDING_INPUT_BYTES


@dataclass(frozen=True, slots=True)
class ResumeOutcome:
    ok: bool
    outputs: list[Outbound]
    """For the new socket: ``session.resumed`` + the replay, or the refusal."""
    replaced: Outbound | None = None
    """For the superseded socket, when one was attached."""


TieredOutput = Outbound | ev.Effect | CloseTransport


class TieredSession:
    def __init__(self, core: SessionCore, options: TieredOptions | None = None) -> None:
        self.core = core
        self.options = o = options or TieredOptions()
        self.session_id = core.session_id
        self.lane = o.lane
        self.tier3 = o.lane == "full"
        self.settings: SessionSettings = default_settings(o.lane, model=o.model, instructions=o.default_instructions)  # type: ignore[arg-type]
        self.capabilities = capabilities(
            lane=o.lane,
            typed_input=core.config.typed_input_ready,
            max_sessions=o.max_sessions,
            function_call_timeout_s=core.config.function_call_timeout_s,
            max_function_calls=core.config.max_function_calls_per_response,
        )
        self.projector = self._new_projector()
        self.journal = Journal(max_bytes=o.journal_max_bytes, ttl_s=o.journal_ttl_s) if self.tier3 else None
        self.credential = ResumeCredential()
        self._seq = 0  # the OpenAI lane's seq counter (no journal)
        self._event_ids = itertools.count(1)
        self._converter = InputConverter(self.settings.input_format, self.settings.input_rate)
        self._created = False
        self._expired = False
        self._close_sent = False
        self._close_code: int | None = None
        self.detached_at: float | None = None
        self.last_activity = 0.0
        self._pending_input: list[Any] = []
        self._pending_bytes = 0
        self._uncommitted = 0
        self._staged_text: tuple[str, str] | None = None  # (item_id, text) waiting for response.create
        self._typed_seq = 0
        self._published_calls: set[str] = set()
        self._answered_calls: set[str] = set()
        self._audio_out = False
        self._requested_prompt: SessionPrompt | None = None
        self._config_acks: list[bool] = []  # per Configure sent: whether a client update waits for session.updated
        self._close_reason = "client_close"
        self._heard_ms = 0
        self._autostart_prefill = False
        self._awaiting_create = False
        self._before_created: list[WireEvent] = []  # session events raised while the first prefill runs

    def _new_projector(self) -> TieredProjector:
        s = self.settings
        return TieredProjector(self.session_id, tier3=self.tier3, output_format=s.output_format,
                               output_rate=s.output_rate, modalities=s.output_modalities,
                               commit_policy=s.playback_commit_policy)

    def _apply_settings(self, s: SessionSettings) -> None:
        old, self.settings = self.settings, s
        proj = self.projector
        proj.output_format, proj.output_rate = s.output_format, s.output_rate
        proj.modalities, proj.commit_policy = s.output_modalities, s.playback_commit_policy
        proj.overlap_policy = s.overlap_policy
        if (old.input_format, old.input_rate) != (s.input_format, s.input_rate):
            self._converter = InputConverter(s.input_format, s.input_rate)
        self.core.auto_eou = s.auto_response
        if s.eou_blank_frames is not None and not self.core.settings_locked:
            self.core.eou_blank_frames = s.eou_blank_frames

    # ================================================================ driving interface

    @property
    def closed(self) -> bool:
        return self.core.closed or self._expired

    @property
    def resumable(self) -> bool:
        return self.tier3

    def start(self, now: float) -> list[TieredOutput]:
        """Autostart (an OpenAI client): ``session.created`` at once, the default prompt prefills behind it."""
        self.last_activity = now
        if not self.options.autostart:
            return []
        self._autostart_prefill = True  # issued by the first poll: effects belong to the shell that runs them
        return [self._session_created()]

    def receive(self, message: Any, now: float) -> list[TieredOutput]:
        if self.closed:
            return []
        if isinstance(message, Detached):
            if message.generation in (None, self.credential.generation):
                self.detach(now)
            return []
        self.last_activity = now
        parsed = p.parse(message)
        out: list[TieredOutput] = []
        if self._requested_prompt is None and not isinstance(parsed, p.SessionUpdate):
            # Any first event but session.update opens a default session, then runs (§1.1); as with autostart,
            # session.created goes first and the default prompt prefills behind it.
            out = [] if self._created else [self._session_created()]
            out += self._configure(self.settings.prompt, None, now, ack=False)
        if isinstance(parsed, p.ParseError):
            return out + self._error(parsed.code, parsed.message, parsed.event_id, parsed.param, now)
        return out + _HANDLERS[type(parsed)](self, parsed, now)

    def poll(self, now: float) -> Tick:
        expiry = self._lease_expiry(now)
        if expiry is not None:
            return Tick(self._expire(expiry, now))
        early: list[TieredOutput] = []
        if self._autostart_prefill:
            self._autostart_prefill = False
            if self._requested_prompt is None:
                early = self._configure(self.settings.prompt, None, now, ack=False)
        tick = self.core.poll(now)
        wake = tick.wake_at
        deadline = self._lease_deadline()
        if deadline is not None and tick.position is None:
            wake = deadline if wake is None else min(wake, deadline)
        return Tick(early + self._project(tick.outputs, now), tick.position, wake)

    def complete(self, position: Position, result: StepResult, now: float) -> list[TieredOutput]:
        if position.transport_frame is not None:  # speech events are stamped with the audio the model has heard
            self._heard_ms = (position.transport_frame + 1) * 80
        return self._project(self.core.complete(position, result, now), now)

    def fail(self, position: Position, error: BaseException, now: float) -> list[TieredOutput]:
        return self._project(self.core.fail(position, error, now), now)

    def prefilled(self, now: float) -> list[TieredOutput]:
        return self._project(self.core.prefilled(now), now)

    def prefill_failed(self, error: BaseException, now: float) -> list[TieredOutput]:
        return self._project(self.core.prefill_failed(error, now), now)

    def synthesis_done(self, job_id: str, pcm16: bytes, now: float) -> list[TieredOutput]:
        return self._project(self.core.synthesis_done(job_id, pcm16, now), now)

    def synthesis_failed(self, job_id: str, error: BaseException, now: float) -> list[TieredOutput]:
        return self._project(self.core.synthesis_failed(job_id, error, now), now)

    def disconnect(self, now: float) -> list[TieredOutput]:
        return self.core.disconnect(now)  # type: ignore[return-value]

    def poisoned(self, failure: str, now: float) -> list[TieredOutput]:
        return self._project(self.core.abort_session("model_cleanup_failed", failure, now), now)

    # ================================================================ lease

    def _lease_deadline(self) -> float | None:
        if self.detached_at is not None:
            return self.detached_at + self.options.disconnect_grace_s
        if self.core.idle:
            return self.last_activity + self.settings.idle_timeout_s
        return None

    def _lease_expiry(self, now: float) -> str | None:
        if self.closed:
            return None
        if self.detached_at is not None and now >= self.detached_at + self.options.disconnect_grace_s:
            return "disconnect_grace_expired"
        if self.core.idle and now >= self.last_activity + self.settings.idle_timeout_s:
            return "idle_ttl_expired"
        return None

    def _expire(self, reason: str, now: float) -> list[TieredOutput]:
        out: list[TieredOutput] = []
        if self.tier3:
            out += self._emit([{"type": "session.expired", "session_id": self.session_id, "reason": reason}], now)
        out += self.core.disconnect(now)
        self._expired = True
        out.append(CloseTransport(CLOSE_NORMAL, reason))
        self._close_sent = True
        return out

    # ================================================================ resume

    def resume(self, request: p.SessionResume, now: float) -> ResumeOutcome:
        """Attach a new socket (§6.4); called synchronously by the server on the event loop."""
        def refuse(code: str, message: str) -> ResumeOutcome:
            return ResumeOutcome(False, [Outbound(compact_json(self._stamp(error_event(code, message, event_id=request.event_id))))])

        if self.closed:
            return refuse("session_resume_expired", "the session has ended")
        if self.journal is None:
            return refuse("unsupported_session_resume", "this session does not support resume")
        if not self.credential.verify(request.resume_token):
            return refuse("invalid_resume_token", "the resume token is not valid for this session")
        replay = self.journal.replay_after(request.last_received_server_event_seq, now)
        if isinstance(replay, ReplayConflict):
            return refuse("session_resume_conflict", f"cursor beyond the last event ({replay.head})")
        if isinstance(replay, ResyncRequired):
            event = {"type": "session.resync_required", "session_id": self.session_id, "reason": replay.reason}
            return ResumeOutcome(False, [Outbound(compact_json(self._stamp(event)))])
        assert isinstance(replay, Replay)
        old_generation = self.credential.generation
        was_attached = self.detached_at is None
        token = self.credential.issue()
        resumed = self._stamp({"type": "session.resumed", "session_id": self.session_id,
                               "session": self._session_object(), "attachment_generation": self.credential.generation,
                               "resume_token": token})
        outputs = [Outbound(compact_json(resumed))] + [Outbound(e.text, e.seq) for e in replay.entries]
        replaced = None
        if was_attached:
            replaced = Outbound(compact_json(self._stamp({"type": "session.replaced", "session_id": self.session_id,
                                                    "attachment_generation": old_generation})))
        self.detached_at = None
        self.last_activity = now
        return ResumeOutcome(True, outputs, replaced)

    def rollback_resume(self) -> None:
        """The activation failed mid-send: the old token is valid again and the session stays detached."""
        self.credential.rollback()

    def detach(self, now: float) -> None:
        """The transport went away: the grace period starts now (the server then wakes the shell)."""
        if self.detached_at is None:
            self.detached_at = now

    # ================================================================ client events

    def _session_update(self, e: p.SessionUpdate, now: float) -> list[TieredOutput]:
        result = apply_update(self.settings, e.session, prompt_locked=self.core.settings_locked,
                              audio_started=self._audio_out)
        if isinstance(result, SettingsError):
            return self._error(result.code, result.message, e.event_id, result.param, now)
        self._apply_settings(result)
        if result.prompt != self._requested_prompt:
            return self._configure(result.prompt, e.event_id, now, ack=True)
        if self._created:
            return self._emit([self._session_event("session.updated")], now)
        return []  # session.created follows the prefill in flight

    def _configure(self, prompt: SessionPrompt, event_id: Any, now: float, *, ack: bool) -> list[TieredOutput]:
        self._requested_prompt = prompt
        self._config_acks.append(ack)
        return self._project(self.core.receive(Configure(prompt, event_id), now), now)

    def _heartbeat(self, e: p.SessionHeartbeat, now: float) -> list[TieredOutput]:
        if not self.tier3:
            return []
        return self._emit([{"type": "session.heartbeat_ack", "session_id": self.session_id}], now)

    def _event_ack(self, e: p.SessionEventAck, now: float) -> list[TieredOutput]:
        if self.journal is None:
            return []
        try:
            self.journal.acknowledge(e.server_event_seq)
        except InvalidAck as exc:
            return self._error("invalid_event_ack", str(exc), e.event_id, "server_event_seq", now)
        return []

    def _close(self, e: p.SessionClose, now: float) -> list[TieredOutput]:
        self._close_reason = e.reason
        return self._project(self.core.receive(Stop(e.event_id), now), now)

    def _resume_late(self, e: p.SessionResume, now: float) -> list[TieredOutput]:
        return self._error("unsupported_session_resume", "session.resume is only valid as the first message",
                            e.event_id, None, now)

    def _append(self, e: p.InputAudioBufferAppend, now: float) -> list[TieredOutput]:
        if e.audio is None:
            return []  # video frames only: accepted and ignored
        fmt = e.format or self.settings.input_format
        rate = e.sample_rate_hz or self.settings.input_rate
        try:
            if (fmt, rate) != (self._converter.format, self._converter.sample_rate):
                self._converter = InputConverter(fmt, rate)
            pcm = self._converter.feed(e.audio)
        except AudioFormatError as exc:
            return self._error(exc.code, str(exc), e.event_id, exc.param, now)
        self._uncommitted += len(e.audio)
        if not pcm:
            return []
        command = AppendAudio(pcm, e.event_id, len(e.audio))
        if not self.core.configured:
            # OpenAI clients stream right after connecting: hold audio until the prompt is prefilled.
            if self._pending_bytes + len(pcm) > self.options.max_pending_input_bytes:
                return self._error("input_backpressure", "too much audio before the session was ready",
                                    e.event_id, None, now)
            self._pending_input.append(command)
            self._pending_bytes += len(pcm)
            return []
        return self._project(self.core.receive(command, now), now)

    def _commit(self, e: p.InputAudioBufferCommit, now: float) -> list[TieredOutput]:
        if e.is_speech is False and not self.core.microphone_turn_open:
            # The client says the buffer holds no speech: drop it and decide to listen (§2).
            self._uncommitted = 0
            self._converter.clear()
            out = self._project(self.core.receive(ClearInput(e.event_id), now), now)
            return out + self._emit([self.projector.listen("silence_or_noise")], now)
        if not self._uncommitted and not self.core.microphone_turn_open:
            if self.core.last_turn_outcome == "eou":
                return []  # the model-owned EOU already took this audio
            return self._error("input_audio_buffer_empty", "no audio to commit", e.event_id, None, now)
        self._uncommitted = 0
        out: list[TieredOutput] = []
        tail = self._converter.flush()
        if tail:
            out += self._submit(AppendAudio(tail, e.event_id), now)
        respond = self.settings.auto_response
        self._awaiting_create = not respond  # auto_response:false: response.create fires the held EOU
        # Before the first prefill is done the commit waits behind the audio it commits.
        out += self._submit(CommitInput(e.event_id, respond=respond), now)
        return out

    def _clear(self, e: p.InputAudioBufferClear, now: float) -> list[TieredOutput]:
        self._converter.clear()
        self._uncommitted = 0
        self._pending_input.clear()
        self._pending_bytes = 0
        out = self._project(self.core.receive(ClearInput(e.event_id), now), now)
        return out + self._emit([{"type": "input_audio_buffer.cleared"}], now)

    def _input_cancel(self, e: p.InputCancel, now: float) -> list[TieredOutput]:
        out = self._clear(p.InputAudioBufferClear(type="input_audio_buffer.clear", event_id=e.event_id), now)
        return out + self._cancel("input_cancel", now, always_advance=True)

    def _text_append(self, e: p.InputTextAppend, now: float) -> list[TieredOutput]:
        self._typed_seq += 1
        job_id = e.event_id if isinstance(e.event_id, str) and e.event_id else f"text_{self._typed_seq}"
        return self._submit(RequestTypedInput(job_id, e.text, e.event_id), now)

    def _submit(self, command: Any, now: float) -> list[TieredOutput]:
        """Input before the first prefill finished waits for it (OpenAI clients do not wait for readiness)."""
        if not self.core.configured:
            self._pending_input.append(command)
            return []
        return self._project(self.core.receive(command, now), now)

    def _item_create(self, e: p.ConversationItemCreate, now: float) -> list[TieredOutput]:
        item = e.item
        kind = item.get("type", "message")
        if kind == "function_call_output":
            return self._function_output(e, now)
        if kind != "message":
            return self._error("bad_event", f"unsupported item type {kind!r}", e.event_id, "item.type", now)
        role = item.get("role", "user")
        content = item.get("content") if isinstance(item.get("content"), list) else []
        texts = [c.get("text") for c in content if isinstance(c, dict) and c.get("type") in ("input_text", "text")]
        item_id = item.get("id") if isinstance(item.get("id"), str) else f"item_text_{next(self._event_ids)}"
        stored = {"id": item_id, "type": "message", "object": "realtime.item", "role": role, "status": "completed",
                  "content": content}
        previous = self.projector.items.add(stored)
        if role == "user" and any(isinstance(t, str) and t for t in texts):
            self._staged_text = (item_id, " ".join(t for t in texts if isinstance(t, str) and t))
        return self._emit([*self.projector.item_added(stored, previous),
                           {"type": "conversation.item.done", "previous_item_id": previous, "item": stored}], now)

    def _function_output(self, e: p.ConversationItemCreate, now: float) -> list[TieredOutput]:
        item = e.item
        call_id, output = item.get("call_id"), item.get("output")
        if call_id not in self._published_calls or call_id in self._answered_calls:
            return self._error("invalid_function_call_output", f"no pending function call {call_id!r}",
                                e.event_id, "item.call_id", now)
        if not isinstance(output, str):
            return self._error("invalid_function_call_output", "output must be a string", e.event_id,
                                "item.output", now)
        raw = self.core.receive(SubmitFunctionOutput(call_id, output, client_event_id=e.event_id), now)
        if any(isinstance(o, ev.Error) for o in raw):
            return self._project(raw, now)
        self._answered_calls.add(call_id)
        stored = {"id": item.get("id") if isinstance(item.get("id"), str) else f"item_fco_{call_id}",
                  "type": "function_call_output", "object": "realtime.item", "call_id": call_id, "output": output,
                  "status": "completed"}
        previous = self.projector.items.add(stored)
        self.projector.pending_create = True  # the response.create openai-agents sends next is satisfied by B
        out = self._emit([*self.projector.item_added(stored, previous),
                          {"type": "conversation.item.done", "previous_item_id": previous, "item": stored}], now)
        return out + self._project(raw, now)

    def _retrieve(self, e: p.ConversationItemRetrieve, now: float) -> list[TieredOutput]:
        item = self.projector.items.get(e.item_id)
        if item is None:
            return self._error("item_not_found", f"no item {e.item_id!r}", e.event_id, "item_id", now)
        return self._emit([{"type": "conversation.item.retrieved", "item": item}], now)

    def _delete(self, e: p.ConversationItemDelete, now: float) -> list[TieredOutput]:
        if not self.projector.items.delete(e.item_id):
            return self._error("item_not_found", f"no item {e.item_id!r}", e.event_id, "item_id", now)
        return self._emit([{"type": "conversation.item.deleted", "item_id": e.item_id}], now)

    def _truncate(self, e: p.ConversationItemTruncate, now: float) -> list[TieredOutput]:
        if e.item_id not in self.projector.items:
            return self._error("item_not_found", f"no item {e.item_id!r}", e.event_id, "item_id", now)
        r = self.projector.response_for_item(e.item_id)
        if r is None:
            return self._error("bad_event", "only assistant audio items can be truncated", e.event_id, "item_id", now)
        end = r.ledger.truncate(e.audio_end_ms)
        self.projector.refresh_history(r)
        event: WireEvent = {"type": "conversation.item.truncated", "item_id": e.item_id,
                            "content_index": e.content_index, "audio_end_ms": end}
        if self.tier3:
            event["event"] = {"type": "conversation.item.truncate", "item_id": e.item_id,
                              "requested_audio_end_ms": e.audio_end_ms, "audio_end_ms": end}
        return self._emit([event], now)

    def _response_create(self, e: p.ResponseCreate, now: float) -> list[TieredOutput]:
        if self._staged_text is not None:
            item_id, text = self._staged_text
            self._staged_text = None
            return self._submit(RequestTypedInput(item_id, text, e.event_id), now)
        if self._awaiting_create:
            self._awaiting_create = False
            return self._project(self.core.receive(RespondNow(e.event_id), now), now)
        if self.projector.pending_create or self.core.cycle is not None:
            return []  # answered by the post-tool response B
        if self.projector.active is not None:
            return self._error("response_already_active", "a response is in progress", e.event_id, None, now)
        return self._error("response_create_without_input", "nothing to respond to: commit audio or add text first",
                            e.event_id, None, now)

    def _response_cancel(self, e: p.ResponseCancel, now: float) -> list[TieredOutput]:
        active = self.projector.active
        if active is None or (e.response_id is not None and e.response_id != active.id):
            if e.response_id is not None and e.response_id in self.projector.responses:
                return []  # a finished or fenced response: benign
            return self._error("response_not_active", "no response is in progress", e.event_id, "response_id", now)
        return self._cancel("client_cancelled", now)

    def _output_clear(self, e: p.OutputAudioBufferClear, now: float) -> list[TieredOutput]:
        if self.projector.active is not None:
            return self._cancel("output_audio_buffer_clear", now, clear=True)
        last = self.projector.last
        if last is None and not self.tier3:
            return []  # nothing was ever played; GA's cleared event needs a response id
        out: WireEvent = {"type": "output_audio_buffer.cleared", "response_id": last.id if last else None}
        if last is not None and last.ledger.unplayed:
            last.ledger.truncate(last.ledger.committed_ms)
            self.projector.refresh_history(last)
            self.projector.fence.advance()
        return self._emit([out], now)

    def _barge_in(self, e: p.BargeIn, now: float) -> list[TieredOutput]:
        return self._cancel("barge_in", now, always_advance=True)

    def _turn_signal(self, e: p.TurnSignal, now: float) -> list[TieredOutput]:
        direct = {"barge_in": "barge_in", "input.cancel": "input.cancel", "response.cancel": "response.cancel",
                  "session.update": "session.update", "conversation.item.create": "conversation.item.create",
                  "conversation.item.delete": "conversation.item.delete",
                  "conversation.item.truncate": "conversation.item.truncate"}
        if e.event in direct:
            body = dict(e.payload or {})
            body["type"] = direct[e.event]
            if e.event_id is not None:
                body.setdefault("event_id", e.event_id)
            return self.receive(compact_json(body), now)
        if not self.tier3:
            return []
        return self._emit([{"type": "turn.event", "session_id": self.session_id, "event": e.event,
                            "turn_state": self.projector.turn_state, "epoch": self.projector.epoch}], now)

    def _playback_ack(self, e: p.PlaybackAck, now: float) -> list[TieredOutput]:
        proj = self.projector
        if e.item_id is not None and e.response_id is not None and e.item_id != f"item_{e.response_id}":
            return self._error("playback_item_mismatch", "item_id does not belong to response_id", e.event_id,
                                "item_id", now)
        rid = e.response_id
        if rid is None and e.item_id is not None:
            r0 = proj.response_for_item(e.item_id)
            rid = r0.id if r0 else None
            if rid is None:
                return self._error("playback_item_not_found", f"no response item {e.item_id!r}", e.event_id,
                                    "item_id", now)
        if rid is None:
            pending = [r for r in proj.responses.values() if r.ledger.unplayed]
            target = pending[0] if len(pending) == 1 else (proj.active or proj.last)
        else:
            target = proj.responses.get(rid)
        if target is None:
            return self._error("playback_item_not_found", f"no response {rid!r}", e.event_id, "response_id", now)
        stale = target.status == "cancelled" or target.superseded or (target.done and target.epoch != proj.epoch)
        before = proj.history_text(target)
        if not stale:
            target.ledger.ack(e.played_ms, e.committed_ms, truncate=bool(e.truncate))
            proj.refresh_history(target)
        if not self.tier3:
            return []
        event = {"type": "playback.acknowledged", "session_id": self.session_id, "epoch": proj.epoch,
                 "response_id": target.id, "item_id": target.item_id, "played_ms": target.ledger.played_ms,
                 "committed_ms": target.ledger.committed_ms, "truncate": bool(e.truncate),
                 "playback": target.ledger.snapshot(),
                 "history_committed": not stale and (target.done or proj.history_text(target) != before)}
        if stale:
            event["stale"] = True
        return self._emit([{"type": "playback.acknowledged", "event": event}], now)

    # ================================================================ cancel (epoch fencing, §4)

    def _cancel(self, reason: str, now: float, *, clear: bool = False, always_advance: bool = False) -> list[TieredOutput]:
        events, native_id = self.projector.cancel(reason, clear=clear)
        if native_id is None and always_advance:
            self.projector.fence.advance()
        out = self._emit(events, now)
        if native_id is not None:
            out += self._project(self.core.receive(CancelResponse(reason), now), now)
        return out

    # ================================================================ outputs

    def _session_object(self) -> dict:
        proj = self.projector
        active = proj.active
        state = {"state": "open", "turn_state": proj.turn_state, "epoch": proj.epoch, "turn_id": 0,
                 "active_request_id": None, "active_response_id": active.id if active else None,
                 "active_response_turn_id": None,
                 "playback": (proj.last.ledger.snapshot() if proj.last else
                              {"generated_ms": 0, "sent_ms": 0, "played_ms": 0, "committed_ms": 0})}
        return render_session(self.settings, session_id=self.session_id, state=state, capabilities=self.capabilities)

    def _session_event(self, type_: str) -> WireEvent:
        return {"type": type_, "session": self._session_object()}

    def _session_created(self) -> Outbound:
        self._created = True
        event: WireEvent = {"type": "session.created", "session": self._session_object()}
        if self.tier3:
            event["attachment_generation"] = 1
            event["resume_token"] = self.credential.issue()
        return Outbound(compact_json(self._stamp(event)))

    def _stamp(self, event: WireEvent) -> WireEvent:
        return {"type": event["type"], "event_id": f"event_{next(self._event_ids)}",
                **{k: v for k, v in event.items() if k != "type"}}

    def _error(self, code: str, message: str, event_id: Any, param: str | None, now: float) -> list[TieredOutput]:
        # a list: the error may come with a journal-overflow notice, and both must go out
        return self._emit([error_event(code, message, event_id=event_id, param=param)], now)

    def _emit(self, events: list[WireEvent], now: float) -> list[TieredOutput]:
        out: list[TieredOutput] = []
        for event in events:
            if not self.tier3 and event["type"] in _TIER3:
                continue
            if not self._created and event["type"] not in _BEFORE_CREATED:
                # session.created comes first (§1.3): hold what a client event raised during the first prefill
                self._before_created.append(event)
                continue
            event = self._stamp(event)
            if event["type"] in _TRANSPORT_LEVEL:
                out.append(Outbound(compact_json(event)))
                continue
            if self.journal is not None:
                recorded = self.journal.record(event, now)
                if recorded.overflow_notice:
                    notice = self._stamp({"type": "session.resync_required", "session_id": self.session_id,
                                          "reason": "journal_overflow"})
                    out.append(Outbound(compact_json(notice)))
                out.append(Outbound(recorded.text, recorded.seq))
            else:
                self._seq += 1
                out.append(Outbound(compact_json({**event, "server_event_seq": self._seq}), self._seq))
        return out

    def _project(self, outputs: list[ev.Output], now: float) -> list[TieredOutput]:
        wire: list[TieredOutput] = []
        for o in outputs:
            if isinstance(o, ev.Effect):
                wire.append(o)
                continue
            if isinstance(o, ev.SessionConfigured):
                wire += self._configured(o, now)
                continue
            if isinstance(o, ev.FunctionCallPublished):
                self._published_calls.add(o.call_id)
            if isinstance(o, ev.AudioDelta):
                self._audio_out = True
                self.last_activity = now
            self.projector.input_ms = self._heard_ms
            barge_in = (isinstance(o, ev.SpeechStarted) and o.source == "microphone"
                        and self.projector.active is not None and self.settings.overlap_policy == "barge_in_on_speech")
            events = self.projector.project(o)
            if barge_in:  # server_vad: speech during a response interrupts it at once (an epoch cancel)
                wire += self._emit(events, now)
                wire += self._cancel("barge_in", now)
                continue
            if isinstance(o, ev.SessionClosed):
                reason = self._close_reason if o.reason == "client_stop" else o.reason
                events.append({"type": "session.closed", "session_id": self.session_id,
                               "epoch": self.projector.epoch, "reason": reason,
                               "event": {"type": "session.closed", "reason": reason}})
                if self._close_code is None:
                    self._close_code = CLOSE_NORMAL
            elif isinstance(o, ev.Error) and o.fatal and self._close_code is None:
                self._close_code = close_code_for(o.code)
                if not any(isinstance(x, ev.SessionClosed) for x in outputs):
                    events.append({"type": "session.closed", "session_id": self.session_id,
                                   "epoch": self.projector.epoch, "reason": o.code,
                                   "event": {"type": "session.closed", "reason": o.code}})
            wire += self._emit(events, now)
        if self.core.closed and not self._close_sent and self._close_code is not None:
            self._close_sent = True
            wire.append(CloseTransport(self._close_code))
        return wire

    def _configured(self, o: ev.SessionConfigured, now: float) -> list[TieredOutput]:
        ack = self._config_acks.pop(0) if self._config_acks else False
        out: list[TieredOutput] = []
        if not self._created:
            out.append(self._session_created())
            out += self._emit([self._session_event("session.updated")], now)
            held, self._before_created = self._before_created, []
            out += self._emit(held, now)
        elif ack:
            out += self._emit([self._session_event("session.updated")], now)
        pending, self._pending_input, self._pending_bytes = self._pending_input, [], 0
        for command in pending:
            out += self._project(self.core.receive(command, now), now)
        if self.settings.initial_user_text and self._typed_seq == 0:
            self._typed_seq += 1
            out += self._project(
                self.core.receive(RequestTypedInput("initial_user_text", self.settings.initial_user_text), now), now)
        return out


_HANDLERS = {
    p.SessionUpdate: TieredSession._session_update,
    p.SessionHeartbeat: TieredSession._heartbeat,
    p.SessionEventAck: TieredSession._event_ack,
    p.SessionClose: TieredSession._close,
    p.SessionResume: TieredSession._resume_late,
    p.InputAudioBufferAppend: TieredSession._append,
    p.InputAudioBufferCommit: TieredSession._commit,
    p.InputAudioBufferClear: TieredSession._clear,
    p.InputCancel: TieredSession._input_cancel,
    p.InputTextAppend: TieredSession._text_append,
    p.ConversationItemCreate: TieredSession._item_create,
    p.ConversationItemRetrieve: TieredSession._retrieve,
    p.ConversationItemDelete: TieredSession._delete,
    p.ConversationItemTruncate: TieredSession._truncate,
    p.ResponseCreate: TieredSession._response_create,
    p.ResponseCancel: TieredSession._response_cancel,
    p.OutputAudioBufferClear: TieredSession._output_clear,
    p.BargeIn: TieredSession._barge_in,
    p.TurnSignal: TieredSession._turn_signal,
    p.PlaybackAck: TieredSession._playback_ack,
}
