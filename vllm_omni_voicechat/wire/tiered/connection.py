"""One tiered session as a sans-I/O protocol object (docs/tiered-dialect.md §2-§6).

It drives a :class:`~vllm_omni_voicechat.session.core.SessionCore` in the model-owned turn policy with the driving
interface of ``shell/driving.py`` (so the same hosts drive it), turns client events into core commands and
projector calls, and stamps and journals what the projector renders. What outlives a socket (journal, credential,
grace and idle TTL) is the lease's (``lease.py``); the input audio buffer (``input_buffer.py``), what answers a turn
(``turn_answer.py``) and how the socket closes (``closing.py``) are their own. Outputs are :class:`WireText` texts
(stamped with ``server_event_seq`` where journaled), core effects and :class:`CloseTransport`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...ids import SYSTEM_IDS, Ids
from ...model.port import SessionPrompt, StepResult
from ...ops.tally import SessionTally
from ...runner.stage0 import Position
from ...session import events as ev
from ...session.commands import (
    AppendAudio,
    CancelResponse,
    ClearInput,
    CommitInput,
    Configure,
    RequestTypedInput,
    RespondFirst,
    Stop,
    SubmitFunctionOutput,
)
from ...session.core import SessionCore, Tick
from ...session.lifecycle import TurnState
from ..session import WireSession
from ..transport import CloseTransport, WireText, compact_json
from . import parser as p
from . import session_events as se
from .audio import InputConverter
from .closing import Closing
from .input_buffer import InputBuffer
from .items import MAX_ITEM_CONTENT_BYTES
from .journal import DEFAULT_MAX_BYTES, DEFAULT_TTL_S, InvalidAck, Journal, ResyncRequired
from .lease import Lease, Reattached, ResumeRefused
from .stamping import Stamping
from .projector import Refused, TieredProjector, WireEvent, function_item_id
from .response_options import unservable_response_options
from .schema import DISCONNECT_GRACE_S, MAX_PENDING_INPUT_BYTES, capabilities
from .settings import SessionSettings, SettingsError, apply_update, default_settings, render_session
from .turn_answer import TurnAnswer


@dataclass(frozen=True, slots=True)
class TieredOptions:
    lane: str = "full"
    model: str | None = None
    autostart: bool = False
    default_instructions: str = ""
    max_sessions: int = 1
    disconnect_grace_s: float = DISCONNECT_GRACE_S
    journal_max_bytes: int = DEFAULT_MAX_BYTES
    journal_ttl_s: float = DEFAULT_TTL_S
    max_pending_input_bytes: int = MAX_PENDING_INPUT_BYTES
    admission_queue: int = 0
    """How many connections the server lets wait for a slot (advertised in capabilities; 0: none)."""
    ids: Ids = SYSTEM_IDS
    """Where resume tokens come from (a seeded source makes a session reproducible)."""


@dataclass(frozen=True, slots=True)
class ResumeOutcome:
    ok: bool
    outputs: list[WireText]
    """For the new socket: ``session.resumed`` + the replay, or the refusal."""
    replaced: WireText | None = None
    """For the superseded socket, when one was attached."""


TieredOutput = WireText | ev.Effect | CloseTransport


class TieredSession(WireSession):
    def __init__(self, core: SessionCore, options: TieredOptions | None = None, *,
                 tally: SessionTally | None = None) -> None:
        super().__init__(core, tally)
        self.options = o = options or TieredOptions()
        self.lane = o.lane
        self.tier3 = o.lane == "full"
        self.settings: SessionSettings = default_settings(o.lane, model=o.model, instructions=o.default_instructions)  # type: ignore[arg-type]
        self.capabilities = capabilities(
            lane=o.lane,
            typed_input=core.config.typed_input_ready,
            max_sessions=o.max_sessions,
            function_call_timeout_s=core.config.function_call_timeout_s,
            max_function_calls=core.config.max_function_calls_per_response,
            admission_queue=o.admission_queue,
        )
        self.projector = self._new_projector()
        self.lease = Lease(resumable=self.tier3, grace_s=o.disconnect_grace_s, journal_max_bytes=o.journal_max_bytes,
                           journal_ttl_s=o.journal_ttl_s, ids=o.ids)
        self.stamping = Stamping(self.session_id, tier3=self.tier3, journal=self.lease.journal)
        self._emit = self.stamping.send  # the send path: stamped, filtered, held or journaled (bound once, it is hot)
        self.input_buffer = InputBuffer(self.settings.input_format, self.settings.input_rate,
                                        o.max_pending_input_bytes)
        self._expired = False
        self.closing = Closing()
        self._typed_seq = 0
        self._published_calls: set[str] = set()
        self._answered_calls: set[str] = set()
        self._audio_out = False
        self._requested_prompt: SessionPrompt | None = None
        self._config_acks: list[bool] = []  # per Configure sent: whether a client update waits for session.updated
        self._autostart_prefill = False
        self.answer = TurnAnswer()

    def _new_projector(self) -> TieredProjector:
        s = self.settings
        return TieredProjector(self.session_id, tier3=self.tier3, output_format=s.output_format,
                               output_rate=s.output_rate, modalities=s.output_modalities,
                               commit_policy=s.playback_commit_policy)

    def _apply_settings(self, s: SessionSettings) -> None:
        old, self.settings = self.settings, s
        self.projector.configure(output_format=s.output_format, output_rate=s.output_rate,
                                 modalities=s.output_modalities, commit_policy=s.playback_commit_policy,
                                 overlap_policy=s.overlap_policy)
        if (old.input_format, old.input_rate) != (s.input_format, s.input_rate):
            self.input_buffer.converter = InputConverter(s.input_format, s.input_rate)
        self.core.tune_turn_taking(auto_eou=s.model_eou, eou_blank_frames=s.eou_blank_frames)

    # What outlives a socket is the lease's: these are its views.

    @property
    def journal(self) -> Journal | None:
        return self.lease.journal

    @property
    def credential(self) -> Any:
        return self.lease.credential

    @property
    def detached_at(self) -> float | None:
        return self.lease.detached_at

    # ================================================================ driving interface

    @property
    def closed(self) -> bool:
        return self.core.closed or self._expired

    @property
    def resumable(self) -> bool:
        return self.tier3

    def start(self, now: float) -> list[TieredOutput]:
        """Autostart (an OpenAI client): ``session.created`` at once, the default prompt prefills behind it."""
        self.lease.touch(now)
        if not self.options.autostart:
            return []
        self._autostart_prefill = True  # issued by the first poll: effects belong to the shell that runs them
        return [self._session_created()]

    def receive(self, message: str | bytes, now: float, arrived: float | None = None) -> list[TieredOutput]:
        if self.closed:
            return []
        self.lease.touch(now)
        parsed = p.parse(message)
        out: list[TieredOutput] = []
        if self._requested_prompt is None and not isinstance(parsed, p.SessionUpdate):
            # Any first event but session.update opens a default session, then runs (§1.1); as with autostart,
            # session.created goes first and the default prompt prefills behind it.
            out = [] if self.stamping.created else [self._session_created()]
            out += self._configure(self.settings.prompt, None, now, ack=False)
        if arrived is not None and type(parsed) is p.InputAudioBufferAppend:
            return out + self._append(parsed, now, arrived)
        return out + self._dispatch(parsed, now)

    def _dispatch(self, parsed: p.ClientEvent | p.ParseError, now: float) -> list[TieredOutput]:
        if isinstance(parsed, p.ParseError):
            return self._error(parsed.code, parsed.message, parsed.event_id, parsed.param, now)
        return _HANDLERS[type(parsed)](self, parsed, now)

    def poll(self, now: float) -> Tick:
        expiry = None if self.closed else self.lease.expiry(now, idle=self.core.idle,
                                                              idle_timeout_s=self.settings.idle_timeout_s)
        if expiry is not None:
            return Tick(self._expire(expiry, now))
        early: list[TieredOutput] = []
        if self._autostart_prefill:
            self._autostart_prefill = False
            if self._requested_prompt is None:
                early = self._configure(self.settings.prompt, None, now, ack=False)
        tick = self.core.poll(now)
        wake = tick.wake_at
        deadline = self.lease.deadline(idle=self.core.idle, idle_timeout_s=self.settings.idle_timeout_s)
        if deadline is not None and tick.position is None:
            wake = deadline if wake is None else min(wake, deadline)
        return Tick(early + self._project(tick.outputs, now), tick.position, wake)

    def complete(self, position: Position, result: StepResult, now: float) -> list[TieredOutput]:
        if position.transport_frame is not None:  # speech events are stamped with the audio the model has heard
            self.projector.heard((position.transport_frame + 1) * 80)
        return super().complete(position, result, now)

    def refuse(self, event_id: Any, now: float) -> list[TieredOutput]:
        """The host's inbox was full: this frame was not read (stamped and journaled like any server event)."""
        return self._emit([se.error_event("input_backpressure", "the receive queue is full; event refused",
                                          event_id=event_id, retryable=True)], now)

    # ================================================================ lease and resume

    def _expire(self, reason: str, now: float) -> list[TieredOutput]:
        out: list[TieredOutput] = []
        if self.tier3:
            out += self._emit([se.session_expired(self.session_id, reason)], now)
        out += self.core.disconnect(now)
        self._expired = True
        out.append(self.closing.expired(reason))
        return out

    def resume(self, request: p.SessionResume, now: float) -> ResumeOutcome:
        """Attach a new socket (§6.4); called synchronously by the server on the event loop."""
        if self.closed:
            verdict: Reattached | ResumeRefused | ResyncRequired = ResumeRefused(
                "session_resume_expired", "the session has ended")
        else:
            verdict = self.lease.resume(request.resume_token, request.last_received_server_event_seq, now)
        if isinstance(verdict, ResumeRefused):
            error = se.error_event(verdict.code, verdict.message, event_id=request.event_id)
            return ResumeOutcome(False, [self._stamped(error)])
        if isinstance(verdict, ResyncRequired):
            return ResumeOutcome(False, [self._stamped(se.resync_required(self.session_id, verdict.reason))])
        resumed = se.session_resumed(self.session_id, self._session_object(), verdict.generation, verdict.token,
                                     self.input_buffer.receipt())
        outputs = [self._stamped(resumed)] + [WireText(e.text, e.seq) for e in verdict.replay.entries]
        replaced = None
        if verdict.superseded is not None:
            replaced = self._stamped(se.session_replaced(self.session_id, verdict.superseded))
        return ResumeOutcome(True, outputs, replaced)

    def refuse_early(self, request: p.SessionResume) -> ResumeOutcome | None:
        """The refusal of a resume whose token is not this session's, decided before the host settles the session's
        input for it (a wrong token must cost the session nothing); None when only :meth:`resume` can decide."""
        if self.closed or self.lease.journal is None or self.lease.credential.verify(request.resume_token):
            return None
        return self.resume(request, 0.0)  # refused on the token: ``now`` plays no part

    def rollback_resume(self) -> None:
        """The activation failed mid-send: the old token is valid again and the session stays detached."""
        self.lease.rollback()

    def detach(self, now: float) -> list[TieredOutput]:
        """The transport went away: the grace period starts now (the host polls again for its deadline)."""
        self.lease.detach(now)
        return []

    # ================================================================ client events

    def _session_update(self, e: p.SessionUpdate, now: float) -> list[TieredOutput]:
        result = apply_update(self.settings, e.session, prompt_locked=self.core.settings_locked,
                              audio_started=self._audio_out)
        if isinstance(result, SettingsError):
            return self._error(result.code, result.message, e.event_id, result.param, now)
        self._apply_settings(result)
        if result.prompt != self._requested_prompt:
            return self._configure(result.prompt, e.event_id, now, ack=True)
        if self.stamping.created:
            return self._emit([se.session_event("session.updated", self._session_object())], now)
        return []  # session.created follows the prefill in flight

    def _configure(self, prompt: SessionPrompt, event_id: Any, now: float, *, ack: bool) -> list[TieredOutput]:
        self._requested_prompt = prompt
        self._config_acks.append(ack)
        return self._project(self.core.receive(Configure(prompt, event_id), now), now)

    def _heartbeat(self, e: p.SessionHeartbeat, now: float) -> list[TieredOutput]:
        if not self.tier3:
            return []
        return self._emit([se.heartbeat_ack(self.session_id)], now)

    def _event_ack(self, e: p.SessionEventAck, now: float) -> list[TieredOutput]:
        if self.journal is None:
            return []
        try:
            self.journal.acknowledge(e.server_event_seq)
        except InvalidAck as exc:
            return self._error("invalid_event_ack", str(exc), e.event_id, "server_event_seq", now)
        return []

    def _close(self, e: p.SessionClose, now: float) -> list[TieredOutput]:
        self.closing.client_reason = e.reason
        return self._project(self.core.receive(Stop(e.event_id), now), now)

    def _resume_late(self, e: p.SessionResume, now: float) -> list[TieredOutput]:
        return self._error("unsupported_session_resume", "session.resume is only valid as the first message",
                            e.event_id, None, now)

    def _append(self, e: p.InputAudioBufferAppend, now: float, arrived: float | None = None) -> list[TieredOutput]:
        # OpenAI clients stream right after connecting: audio is held until the prompt is prefilled.
        appended = self.input_buffer.append(e, self.settings, held=not self.core.configured, arrived=arrived)
        if isinstance(appended, Refused):
            return self._error(appended.code, appended.message, e.event_id, appended.param, now)
        if appended is None:
            return []
        return self._project(self.core.receive(appended, now), now)

    def _commit(self, e: p.InputAudioBufferCommit, now: float) -> list[TieredOutput]:
        if e.is_speech is False and not self.core.microphone_turn_open:
            # The client says the buffer holds no speech: drop it and decide to listen (§2).
            self.input_buffer.drop()
            out = self._project(self.core.receive(ClearInput(e.event_id), now), now)
            return out + self._emit([self.projector.listen("silence_or_noise")], now)
        if not self.input_buffer.uncommitted and not self.core.microphone_turn_open:
            if self.core.turn_state is TurnState.ANSWERED:
                return []  # the model-owned EOU already took this audio
            return self._error("input_audio_buffer_empty", "no audio to commit", e.event_id, None, now)
        out: list[TieredOutput] = []
        tail = self.input_buffer.commit()
        if tail:
            out += self._submit(AppendAudio(tail, e.event_id), now)
        # Client-owned turns (OpenAI lane, turn_detection null) and auto_response:false: the commit settles the
        # turn and holds its EOU; response.create fires it. Otherwise the commit forces the model's own EOU.
        respond = self.settings.model_eou
        self.answer.committed(respond=respond, openai=not self.tier3)
        # Before the first prefill is done the commit waits behind the audio it commits.
        out += self._submit(CommitInput(e.event_id, respond=respond), now)
        return out

    def _clear(self, e: p.InputAudioBufferClear, now: float) -> list[TieredOutput]:
        self.input_buffer.clear()
        out = self._project(self.core.receive(ClearInput(e.event_id), now), now)
        return out + self._emit([se.input_cleared()], now)

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
            self.input_buffer.hold(command)
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
        size = len(compact_json({"content": content, "role": role}).encode("utf-8", "surrogatepass"))
        if size > MAX_ITEM_CONTENT_BYTES:
            return self._error("event_too_large", f"an item's content is at most {MAX_ITEM_CONTENT_BYTES} bytes of "
                               "JSON", e.event_id, "item.content", now)
        item_id = item.get("id") if isinstance(item.get("id"), str) else f"item_text_{self.stamping.next_id()}"
        events = self.projector.add_client_item(item_id, role, content, size)
        self.answer.stage_text(item_id, role, content)
        return self._emit(events, now)

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
        item_id = item.get("id") if isinstance(item.get("id"), str) else (
            f"item_fco_{call_id}" if self.tier3 else function_item_id(call_id, "fco"))
        out = self._emit(self.projector.add_function_output(item_id, call_id, output), now)
        return out + self._project(raw, now)

    def _retrieve(self, e: p.ConversationItemRetrieve, now: float) -> list[TieredOutput]:
        item = self.projector.item(e.item_id)
        if item is None:
            return self._error("item_not_found", f"no item {e.item_id!r}", e.event_id, "item_id", now)
        return self._emit([se.item_retrieved(item)], now)

    def _delete(self, e: p.ConversationItemDelete, now: float) -> list[TieredOutput]:
        if not self.projector.delete_item(e.item_id):
            return self._error("item_not_found", f"no item {e.item_id!r}", e.event_id, "item_id", now)
        return self._emit([se.item_deleted(e.item_id)], now)

    def _truncate(self, e: p.ConversationItemTruncate, now: float) -> list[TieredOutput]:
        return self._answer(self.projector.truncate(e.item_id, e.content_index, e.audio_end_ms), e.event_id, now)

    def _response_create(self, e: p.ResponseCreate, now: float) -> list[TieredOutput]:
        instructions = (e.response or {}).get("instructions")
        if self.tier3 and instructions is not None:  # vLLM-Omni's vocabulary refuses per-response instructions
            return self._error("unsupported_native_response_options", "response.instructions is not supported by "
                               "this model", e.event_id, "response.instructions", now)
        if not self.tier3:
            refused = unservable_response_options(e, self.settings)
            if refused is not None:
                return self._error(refused.code, refused.message, e.event_id, refused.param, now)
        if not self.tier3 and self.projector.active is None:
            metadata = (e.response or {}).get("metadata")
            self.projector.next_metadata = dict(metadata) if isinstance(metadata, dict) else None
        command = self.answer.create(e.event_id)
        if command is not None:
            return self._submit(command, now)  # behind a commit or the first prefill still in flight
        if self.projector.pending_create or self.core.cycle is not None:
            return []  # answered by the post-tool response B
        if not self.tier3 and self.settings.model_eou and self.answer.answering(self.projector.active,
                                                                         self.core.microphone_turn_settling):
            return []  # the model's own end of turn answers (being opened or open): nothing more to start
        if not self.tier3 and self.projector.active is None and instructions:
            return self._speak_instructions(instructions, e.event_id, now)
        if self.projector.active is not None:
            if not self.tier3:  # OpenAI's code (Pipecat reads on after it, and only after a few codes)
                return self._error("conversation_already_has_active_response",
                                   f"Conversation already has an active response in progress: {self.projector.active.id}",
                                   e.event_id, None, now)
            return self._error("response_already_active", "a response is in progress", e.event_id, None, now)
        if not self.tier3:  # nothing to answer: the model speaks first (a greeting; GA clients start with it)
            return self._submit(RespondFirst(e.event_id), now)
        return self._error("response_create_without_input", "nothing to respond to: commit audio or add text first",
                            e.event_id, None, now)

    def _speak_instructions(self, instructions: Any, event_id: Any, now: float) -> list[TieredOutput]:
        """Per-response instructions (LiveKit's ``generate_reply(instructions=...)`` sends the session's, a newline
        and its own): this model's instructions are its prompt, resident since the session's first position, so
        the extra text is what the model hears, as typed input through the synthesizer; without one the model
        speaks first from its prompt."""
        text = str(instructions)
        own = self.settings.instructions
        if own and text.startswith(own):
            text = text[len(own):]
        text = text.strip()
        if text and self.core.config.typed_input_ready:
            return self._submit(RequestTypedInput(f"instructions_{self.stamping.next_id()}", text, event_id), now)
        return self._submit(RespondFirst(event_id), now)

    def _response_cancel(self, e: p.ResponseCancel, now: float) -> list[TieredOutput]:
        active = self.projector.active
        if active is None or (e.response_id is not None and e.response_id != active.id):
            if e.response_id is not None and e.response_id in self.projector.responses:
                return []  # a finished or fenced response: benign
            if not self.tier3:  # OpenAI's code and message (Pipecat reads on after it, LiveKit ignores it)
                return self._error("response_cancel_not_active", "Cancellation failed: no active response found",
                                   e.event_id, "response_id", now)
            return self._error("response_not_active", "no response is in progress", e.event_id, "response_id", now)
        return self._cancel("client_cancelled", now)

    def _output_clear(self, e: p.OutputAudioBufferClear, now: float) -> list[TieredOutput]:
        if self.projector.active is not None:
            return self._cancel("output_audio_buffer_clear", now, clear=True)
        return self._emit(self.projector.clear_output(), now)

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
            return self._dispatch(p.parse_object(body), now)  # the signalled event, as if the client sent it
        if not self.tier3:
            return []
        return self._emit([se.turn_event(self.session_id, e.event, self.projector.turn_state, self.projector.epoch)],
                          now)

    def _playback_ack(self, e: p.PlaybackAck, now: float) -> list[TieredOutput]:
        return self._answer(self.projector.playback_ack(e), e.event_id, now)

    # ================================================================ cancel (epoch fencing, §4)

    def _cancel(self, reason: str, now: float, *, clear: bool = False,
                always_advance: bool = False) -> list[TieredOutput]:
        events, native_id = self.projector.cancel(reason, clear=clear, always_advance=always_advance)
        out = self._emit(events, now)
        if native_id is not None:
            out += self._project(self.core.receive(CancelResponse(reason), now), now)
        return out

    # ================================================================ outputs

    def _session_object(self) -> dict:
        return render_session(self.settings, session_id=self.session_id, state=self.projector.session_state(),
                              capabilities=self.capabilities)

    def _session_created(self) -> WireText:
        self.stamping.created = True
        if self.tier3:
            token = self.credential.issue()
            return self._stamped(se.session_created(self._session_object(), generation=self.credential.generation,
                                                    resume_token=token))
        return self._stamped(se.session_created(self._session_object()))

    def _stamped(self, event: WireEvent) -> WireText:
        return self.stamping.transport(event)

    def _error(self, code: str, message: str, event_id: Any, param: str | None, now: float) -> list[TieredOutput]:
        if self.tally is not None:
            self.tally.wire_error(code)
        # a list: the error may come with a journal-overflow notice, and both must go out
        return self._emit([se.error_event(code, message, event_id=event_id, param=param)], now)

    def _answer(self, answer: list[WireEvent] | Refused, event_id: Any, now: float) -> list[TieredOutput]:
        """What the projector made of a client request: its events, or the error it refused it with."""
        if isinstance(answer, Refused):
            return self._error(answer.code, answer.message, event_id, answer.param, now)
        return self._emit(answer, now)

    def _project(self, outputs: list[ev.Output], now: float) -> list[TieredOutput]:
        if self.tally is not None:
            self.tally.observe_all(outputs, now)
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
                self.lease.touch(now)
            elif not self.tier3 and self.answer.hides(o, self.settings):
                continue
            barge_in = (isinstance(o, ev.SpeechStarted) and o.source == "microphone"
                        and self.projector.active is not None and self.settings.overlap_policy == "barge_in_on_speech")
            events = self.projector.project(o)
            if isinstance(o, ev.ResponseCreated):
                self.answer.created(self.projector.active)
            elif isinstance(o, ev.ListenDecision) and not self.tier3 and o.reason == "silence_or_noise":
                events += self.answer.unheard_commit(o)
            if barge_in:  # server_vad: speech during a response interrupts it at once (an epoch cancel)
                wire += self._emit(events, now)
                wire += self._cancel("barge_in", now)
                continue
            if isinstance(o, ev.SessionClosed):
                reason = self.closing.session_closed(o.reason)
                events.append(se.session_closed(self.session_id, self.projector.epoch, reason))
            elif isinstance(o, ev.Error) and o.fatal and self.closing.failed(o.code):
                if not any(isinstance(x, ev.SessionClosed) for x in outputs):
                    events.append(se.session_closed(self.session_id, self.projector.epoch, o.code))
            wire += self._emit(events, now)
        if self.core.closed:
            wire += self.closing.transport()
        return wire

    def _configured(self, o: ev.SessionConfigured, now: float) -> list[TieredOutput]:
        ack = self._config_acks.pop(0) if self._config_acks else False
        out: list[TieredOutput] = []
        if not self.stamping.created:
            out.append(self._session_created())
            out += self._emit([se.session_event("session.updated", self._session_object())], now)
            out += self.stamping.release_held(now)
        elif ack:
            out += self._emit([se.session_event("session.updated", self._session_object())], now)
        for command in self.input_buffer.take_held():
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
