"""One v3 connection as a sans-I/O protocol object: parse client frames, apply the v3 configuration rules,
drive the session core, and project its outputs onto v3 wire events (plus effects and the close code).

It offers the driving interface of ``shell/driving.py`` (``receive``, ``poll``, ``complete``, ...), so the same
hosts drive it; its events come out as :class:`~vllm_omni_voicechat.wire.transport.WireText` JSON texts.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ...model.port import SessionPrompt
from ...ops.tally import SessionTally
from ...session import events as ev
from ...session.commands import (
    AppendAudio,
    CommitTurn,
    Configure,
    RequestTypedInput,
    StartTurn,
    Stop,
    SubmitFunctionOutput,
)
from ...session.core import SessionCore, Tick
from ..transport import (
    CloseTransport,
    WireText,
    close_reason,
    compact_json,
    server_json,
)
from ..limits import message_bytes
from ..session import WireSession
from . import parser
from .project import V3Projector, WireEvent
from .schema import (
    CLOSE_NORMAL,
    CONFIGURE_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    MODEL_OUTPUT_MODE,
    PROTOCOL,
    RECEIVE_QUEUE_MESSAGES,
    capabilities,
    close_code_for,
    created_session,
)

V3Output = WireText | ev.Effect | CloseTransport


@dataclass(frozen=True, slots=True)
class V3Options:
    default_instructions: str = ""
    """What ``instructions: null`` restores (the server's system-prompt option)."""
    checkpoint: dict[str, Any] = field(default_factory=dict)
    """Provenance advertised in ``session.created``."""
    single_client: bool = False
    turn_policy: str = "client"
    """``client``: the contract's client-owned turns. ``model``: its diagnostic RNNT-owned ("legacy") mode (the core
    runs the same policy): the model's own end-of-utterance opens responses; ``turn_start`` and ``commit`` get the
    recoverable ``unsupported_event``."""
    max_inbox_messages: int = RECEIVE_QUEUE_MESSAGES
    """The host's inbox bound, echoed by the ``input_backpressure`` error that answers a refused frame."""
    configure_timeout_s: float | None = CONFIGURE_TIMEOUT_S
    """A session with no ``session.update`` this long after ``session.created`` ends (fatal
    ``session_configure_timeout``, ``session.closed``, close 1000): a socket that never speaks holds no slot."""
    idle_timeout_s: float | None = IDLE_TIMEOUT_S
    """A session whose client has sent nothing this long while the model merely listens ends the same way (fatal
    ``session_idle_timeout``). A client streaming its microphone (silence included) never reaches it."""


@dataclass(frozen=True, slots=True)
class _Held:
    """A client frame held behind an unfinished barrier, and when the host read it."""

    message: str | bytes
    arrived: float


@dataclass(frozen=True, slots=True)
class _HeldRefusal:
    """A frame the host's inbox refused while earlier frames were held: answered in its place in the order."""

    event_id: Any


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class V3Session(WireSession):
    def __init__(self, core: SessionCore, options: V3Options | None = None, *,
                 tally: SessionTally | None = None) -> None:
        super().__init__(core, tally)
        self.options = options = options or V3Options()
        if options.turn_policy != core.config.turn_policy:
            raise ValueError(f"a v3 session with turn_policy={options.turn_policy!r} needs a core with the same policy")
        self.capabilities = capabilities(
            typed_input=core.config.typed_input_ready,
            max_session_model_frames=core.config.max_session_model_frames,
            single_client=options.single_client,
            model_turns=options.turn_policy == "model",
            function_call_timeout_s=core.config.function_call_timeout_s,
            function_recovery_max_frames=core.config.function_recovery_max_frames,
        )
        self.projector = V3Projector(self.session_id, self.capabilities)
        self._configured_once = False
        self._model_output_mode: str | None = None
        self._close_code: int | None = None
        self._close_reason = ""
        self._close_sent = False
        # The receive pump's order (contract §1): a frame is handled only after the effects of the frames before
        # it. While a barrier is unfinished (the prefill of a session.update, a turn_start or commit whose ack has
        # not been published) later frames wait here, in arrival order; the host counts them against its inbox.
        self._held: deque[_Held | _HeldRefusal] = deque()
        self._awaiting_ack: str | None = None
        self._wire_bytes = 0
        self._started_at = 0.0
        self._last_message_at = 0.0

    # ================================================================ driving interface

    def start(self, now: float) -> list[V3Output]:
        """The greeting: ``session.created`` is the first event of every admitted connection."""
        self._started_at = self._last_message_at = now
        return [
            _text(self.projector.envelope(
                "session.created",
                protocol=dict(PROTOCOL),
                capabilities=self.capabilities,
                session=created_session(self.session_id, self.options.checkpoint),
            ))
        ]

    @property
    def held_messages(self) -> int:
        """Client frames received but waiting behind an unfinished barrier (part of the receive pump)."""
        return len(self._held)

    @property
    def at_barrier(self) -> bool:
        """A barrier's effects are unfinished: the prefill runs, or a turn barrier waits for its ack or runs."""
        core = self.core
        # A turn barrier's effects run until its procedure ends (a commit's: settlement, the ack, the EOU position).
        # A published function cycle defers turn barriers (their acks come on replay): it holds nothing here.
        return core.configuring or (
            (self._awaiting_ack is not None or core.barrier_running) and core.functions.cycle is None
        )

    def receive(self, message: str | bytes, now: float, arrived: float | None = None) -> list[V3Output]:
        if self.core.closed:
            return []
        self._last_message_at = now
        if self._held or self.at_barrier:
            self._held.append(_Held(message, now if arrived is None else arrived))
            return []
        return self._receive(message, now, arrived)

    def _settle(self, outputs: list[ev.Output], now: float) -> list[V3Output]:
        """A completion may finish the barrier that held frames: they are handed on after its outputs."""
        return self._release(self._project(outputs, now), now)

    def _release(self, wire: list[V3Output], now: float) -> list[V3Output]:
        """Hand the held frames on, in order, while no barrier is unfinished."""
        while self._held and not self.at_barrier and not self.core.closed:
            item = self._held.popleft()
            if isinstance(item, _HeldRefusal):
                wire.extend(self._refusal(item.event_id))
            else:
                wire.extend(self._receive(item.message, now))  # late only from its release (the protocol's wait)
        if self.core.closed:
            self._held.clear()
        return wire

    def _feed_settlement(self, now: float) -> list[V3Output]:
        """Quiet audio the client sent after its commit may feed the settlement instead of zeros (contract section 7):
        held appends go on to the core, one at a time and in order, while its next position is a settlement's that
        would take them. Anything but a well-formed append stays held and stops this, so nothing is answered out of
        order; the core keeps any speech for after the response starts."""
        held, core = self._held, self.core
        wire: list[V3Output] = []
        while held and core.settlement_takes_audio(now):
            item = held[0]
            if isinstance(item, _HeldRefusal):
                break
            env = parser.read(item.message)
            if isinstance(env, parser.Refused) or env.type != "input_audio_buffer.append":
                break
            append = parser.append(env)
            if isinstance(append, parser.Refused):
                break
            held.popleft()
            command = AppendAudio(append.pcm, append.event_id, message_bytes(item.message), item.arrived)
            wire.extend(self._project(core.receive(command, now), now))  # late from when it was read
        return wire

    def _receive(self, message: str | bytes, now: float, arrived: float | None = None) -> list[V3Output]:
        self._wire_bytes = message_bytes(message)
        env = parser.read(message)
        if isinstance(env, parser.Refused):
            return [self._refused(env)]
        if arrived is not None and env.type == "input_audio_buffer.append":
            return self._append(env, now, arrived)
        return _HANDLERS[env.type](self, env, now)

    def poll(self, now: float) -> Tick:
        silence = self._silence(now)
        if silence is not None:
            code, message = silence
            return Tick(self._project(self.core.abort_session(code, message, now, closed=("failed", code)), now))
        fed = self._feed_settlement(now) if self._held else []
        tick = self.core.poll(now)
        outputs = self._project(tick.outputs, now)
        if fed:
            outputs[:0] = fed
        if self._held and not self.at_barrier:
            outputs = self._release(outputs, now)
            if tick.position is None:
                return Tick(outputs, None, now)  # released frames may have queued work: poll again at once
        wake = tick.wake_at
        if tick.position is None and (deadline := self._silence_deadline()) is not None:
            wake = deadline if wake is None else min(wake, deadline)
        if not outputs and not tick.outputs and wake == tick.wake_at:
            return tick  # nothing to project and no deadline of ours sooner: the core's tick says it all
        return Tick(outputs, tick.position, wake)

    def _silence_deadline(self) -> float | None:
        """When a silent client's session ends, if it stays silent (None: it cannot, now)."""
        if self.core.closed:
            return None
        options = self.options
        if not (self.core.configured or self.core.configuring or self._held):
            if options.configure_timeout_s is not None:
                return self._started_at + options.configure_timeout_s
        elif options.idle_timeout_s is not None and self.core.idle and not self._held:
            return self._last_message_at + options.idle_timeout_s
        return None

    def _silence(self, now: float) -> tuple[str, str] | None:
        idle_s = self.options.idle_timeout_s
        if self.core.configured and (idle_s is None or now < self._last_message_at + idle_s):
            return None  # every poll: a configured session that heard from its client within the idle timeout
        deadline = self._silence_deadline()
        if deadline is None or now < deadline:
            return None
        if not (self.core.configured or self.core.configuring):
            return ("session_configure_timeout",
                    f"no session.update within {self.options.configure_timeout_s:g} s of session.created")
        return ("session_idle_timeout", f"no client event for {self.options.idle_timeout_s:g} s while idle")

    def refuse(self, event_id: Any, now: float) -> list[V3Output]:
        """The host's inbox was full: this frame was not read (answered in its place behind held frames)."""
        if self.core.closed:
            return []
        if self._held or self.at_barrier:
            self._held.append(_HeldRefusal(event_id))
            return []
        return self._refusal(event_id)

    def _refusal(self, event_id: Any) -> list[V3Output]:
        return [self._error("input_backpressure", "the receive queue is full; event refused", event_id,
                            limit=self.options.max_inbox_messages)]

    def output_backpressure(self, *, peak_queued_bytes: int, max_outbound_bytes: int,
                            max_outbound_events: int) -> WireText:
        """The fatal error for a client that stopped reading (sent once its queued events were discarded)."""
        return _text(self.projector.error(
            "output_backpressure", "the client is not reading server events fast enough", True,
            peak_queued_bytes=peak_queued_bytes, max_outbound_bytes=max_outbound_bytes,
            max_outbound_events=max_outbound_events))

    # ================================================================ client events
    # Each handler runs the checks the contract puts before the event's shape, then its parser, then the rest.

    def _session_update(self, env: parser.Envelope, now: float) -> list[V3Output]:
        cid = env.event_id
        if self.core.settings_locked or self.core.input_active:
            return [self._error("settings_locked", "session settings are locked after the first model input", cid)]
        update = parser.session_update(env)
        if isinstance(update, parser.Refused):
            return [self._refused(update)]
        version = update.version
        version_ok = _is_int(version) and version == PROTOCOL["version"]
        if not self._configured_once and not version_ok:
            requested = None if version is parser.MISSING else version
            return self._project(
                self.core.abort_session(
                    "unsupported_protocol_version",
                    f"this server speaks voicechat.realtime version 3, not {requested!r}",
                    now,
                    client_event_id=cid,
                    details={"requested_version": requested},
                    closed=("failed", "unsupported_protocol_version"),
                ), now)
        if version is not parser.MISSING and not version_ok:
            return [self._error("unsupported_protocol_version", f"protocol_version must be 3, not {version!r}", cid,
                                requested_version=version)]
        if update.capabilities is not None:
            return [self._refused(update.capabilities)]
        mode = self._model_output_mode
        if update.model_output_mode is not parser.MISSING:
            if self._configured_once and update.model_output_mode != mode:
                return [self._error("settings_locked", "negotiated capabilities cannot change", cid)]
            mode = update.model_output_mode
        if update.problem is not None:
            return [self._refused(update.problem)]
        current = self.core.prompt or SessionPrompt(self.options.default_instructions)
        instructions = update.instructions
        if instructions is parser.MISSING:
            instructions = current.instructions
        elif instructions is None:
            instructions = self.options.default_instructions
        tools = current.tools if update.tools is parser.MISSING else update.tools
        self._model_output_mode = mode
        return self._project(self.core.receive(Configure(SessionPrompt(instructions, tools), cid), now), now)

    def _append(self, env: parser.Envelope, now: float, arrived: float | None = None) -> list[V3Output]:
        if not self.core.configured:
            return [self._error("session_not_configured", "send session.update before audio", env.event_id)]
        append = parser.append(env)
        if isinstance(append, parser.Refused):
            return [self._refused(append)]
        command = AppendAudio(append.pcm, append.event_id, self._wire_bytes, arrived)
        return self._project(self.core.receive(command, now), now)

    def _barrier(self, env: parser.Envelope, now: float) -> list[V3Output]:
        if self.core.model_turns:  # the model owns turns: there are no client barriers
            return [self._error("unsupported_event", f"Unsupported event: {env.type}", env.event_id)]
        barrier = parser.barrier(env)
        if isinstance(barrier, parser.Refused):
            return self._violation(barrier.code, barrier.message, now, barrier.event_id)
        event_id = barrier.event_id
        command: StartTurn | CommitTurn
        if isinstance(barrier, parser.TurnStart):
            command = StartTurn(barrier.client_turn_id, event_id, self._wire_bytes)
        else:
            command = CommitTurn(barrier.client_turn_id, event_id, self._wire_bytes)
        deferred = self.core.functions.holds(command)  # a deferred barrier is acked when it is replayed
        outputs = self.core.receive(command, now)
        if not deferred and not self.core.closed and not any(
            isinstance(o, (ev.Error, ev.TurnStarted, ev.TurnCommitted)) and o.client_event_id == event_id
            for o in outputs
        ):
            self._awaiting_ack = event_id  # queued behind the work before it: later frames wait for its ack
        return self._project(outputs, now)

    def _typed(self, env: parser.Envelope, now: float) -> list[V3Output]:
        request = parser.typed_request(env)
        command = RequestTypedInput(request.job_id, request.text, request.event_id)
        return self._project(self.core.receive(command, now), now)

    def _item_create(self, env: parser.Envelope, now: float) -> list[V3Output]:
        output = parser.item_create(env)
        if isinstance(output, parser.Refused):
            return [self._refused(output)]
        if not (self.core.prompt and self.core.prompt.tools):
            return [self._error("tools_not_set", "no tools are configured for this session", output.event_id)]
        command = SubmitFunctionOutput(
            call_id=output.call_id,
            output=output.output,
            model_output=output.model_output,
            model_output_negotiated=self._model_output_mode == MODEL_OUTPUT_MODE,
            client_event_id=output.event_id,
        )
        return self._project(self.core.receive(command, now), now)

    def _stop(self, env: parser.Envelope, now: float) -> list[V3Output]:
        return self._project(self.core.receive(Stop(parser.stop(env).event_id), now), now)

    # ================================================================ outputs

    def _refused(self, refused: parser.Refused) -> WireText:
        return self._error(refused.code, refused.message, refused.event_id, **(refused.details or {}))

    def _error(self, code: str, message: str, client_event_id: Any = None, **details: Any) -> WireText:
        if self.tally is not None:
            self.tally.wire_error(code)
        return _text(self.projector.error(code, message, False, client_event_id, **details))

    def _violation(self, code: str, message: str, now: float, client_event_id: str | None) -> list[V3Output]:
        return self._project(self.core.abort_session(code, message, now, client_event_id=client_event_id), now)

    def _project(self, outputs: list[ev.Output], now: float) -> list[V3Output]:
        if not outputs and (self._close_sent or self._close_code is None):
            return []  # most polls: nothing happened and no close is due
        if self.tally is not None:
            self.tally.observe_all(outputs, now)
        wire: list[V3Output] = []
        project = self.projector.project
        for o in outputs:
            if type(o) in _SERVER_MADE:  # a position's metrics and deltas: most events, and none of the cases below
                wire.append(WireText(server_json(project(o))))
            elif isinstance(o, ev.Effect):
                wire.append(o)
            elif isinstance(o, ev.ListenDecision):
                continue  # legacy turns: a candidate turn without words is closed by its speech_stopped/completed
            elif isinstance(o, ev.SessionConfigured):
                self._configured_once = True
                wire.append(_text(self.projector.session_updated(o, self._model_output_mode)))
            else:
                if isinstance(o, (ev.TurnStarted, ev.TurnCommitted)) and o.client_event_id == self._awaiting_ack:
                    self._awaiting_ack = None
                wire.append(WireText(compact_json(project(o))))
                if isinstance(o, ev.Error) and o.fatal and self._close_code is None:
                    self._close_code = close_code_for(o.code)
                    self._close_reason = o.code
                elif isinstance(o, ev.SessionClosed) and self._close_code is None:
                    self._close_code = CLOSE_NORMAL
                    self._close_reason = o.reason
        if self.core.closed and not self._close_sent and self._close_code is not None:
            self._close_sent = True
            self._awaiting_ack = None
            wire.append(CloseTransport(self._close_code, close_reason(self._close_reason)))
        return wire


_SERVER_MADE = frozenset({ev.PositionMetrics, ev.AudioDelta, ev.TextDelta, ev.TranscriptDelta})
"""Native events whose wire form holds only the server's values (no echoed client id): the fast JSON path."""


def busy_error(session_id: str) -> WireText:
    """The answer of a server whose session slots are all in use (then close 1013)."""
    return _text(V3Projector(session_id, {}).error("server_busy", "all session slots are in use", True))


def _text(event: WireEvent) -> WireText:
    return WireText(compact_json(event))


_HANDLERS = {
    "session.update": V3Session._session_update,
    "input_audio_buffer.append": V3Session._append,
    "input_audio_buffer.turn_start": V3Session._barrier,
    "input_audio_buffer.commit": V3Session._barrier,
    "input_text.request": V3Session._typed,
    "conversation.item.create": V3Session._item_create,
    "session.stop": V3Session._stop,
}
