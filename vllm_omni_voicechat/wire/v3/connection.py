"""One v3 connection as a sans-I/O protocol object: parse client frames, apply the v3 configuration rules,
drive the session core, and project its outputs onto v3 wire events (plus effects and the close code).

It offers the same driving interface as :class:`~vllm_omni_voicechat.session.core.SessionCore` (``receive``,
``poll``, ``complete``, ...), so the same asyncio shell hosts either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ...model.port import SessionPrompt, StepResult
from ...runner.stage0 import Position
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
from ...session.tools import InvalidTools, normalize_tools
from ..transport import CloseTransport
from .audio import AudioRejected, decode_append
from .project import V3Projector, WireEvent
from .schema import CLOSE_NORMAL, MODEL_OUTPUT_MODE, PROTOCOL, capabilities, close_code_for, created_session

_MISSING = object()
V3Output = WireEvent | ev.Effect | CloseTransport


@dataclass(frozen=True, slots=True)
class V3Options:
    default_instructions: str = ""
    """What ``instructions: null`` restores (the server's system-prompt option)."""
    checkpoint: dict[str, Any] = field(default_factory=dict)
    """Provenance advertised in ``session.created``."""
    single_client: bool = False
    legacy_turns: bool = False


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class V3Session:
    def __init__(self, core: SessionCore, options: V3Options | None = None) -> None:
        self.core = core
        self.options = options = options or V3Options()
        self.session_id = core.session_id
        self.capabilities = capabilities(
            typed_input=core.config.typed_input_ready,
            max_session_model_frames=core.config.max_session_model_frames,
            single_client=options.single_client,
            legacy_turns=options.legacy_turns,
            function_call_timeout_s=core.config.function_call_timeout_s,
            function_recovery_max_frames=core.config.function_recovery_max_frames,
        )
        self.projector = V3Projector(self.session_id, self.capabilities)
        self._configured_once = False
        self._model_output_mode: str | None = None
        self._close_code: int | None = None
        self._close_sent = False
        self._wire_bytes = 0

    # ================================================================ driving interface

    @property
    def closed(self) -> bool:
        return self.core.closed

    def start(self, now: float) -> list[V3Output]:
        """The greeting: ``session.created`` is the first event of every admitted connection."""
        return [
            self.projector.envelope(
                "session.created",
                protocol=dict(PROTOCOL),
                capabilities=self.capabilities,
                session=created_session(self.session_id, self.options.checkpoint),
            )
        ]

    def poisoned(self, failure: str, now: float) -> list[V3Output]:
        """The previous session's model cleanup failed: this session fails before it starts."""
        return self._project(self.core.abort_session("model_cleanup_failed", failure, now))

    def receive(self, message: str | bytes, now: float) -> list[V3Output]:
        if self.core.closed:
            return []
        self._wire_bytes = len(message) if isinstance(message, bytes) or message.isascii() else len(message.encode())
        if isinstance(message, (bytes, bytearray)):
            return [self._error("binary_audio_unsupported", "binary frames are not supported; send JSON text")]
        try:
            msg = json.loads(message)
        except (ValueError, RecursionError) as exc:  # RecursionError: hostile nesting depth
            return [self._error("invalid_json", f"invalid JSON: {exc}")]
        if not isinstance(msg, dict):
            return [self._error("invalid_event", "a client event must be a JSON object")]
        type_ = msg.get("type")
        handler = _HANDLERS.get(type_) if isinstance(type_, str) else None
        if handler is None:
            return [self._error("unsupported_event", f"Unsupported event: {type_}", _event_id(msg))]
        return handler(self, msg, now)

    def poll(self, now: float) -> Tick:
        tick = self.core.poll(now)
        return Tick(self._project(tick.outputs), tick.position, tick.wake_at)

    def complete(self, position: Position, result: StepResult, now: float) -> list[V3Output]:
        return self._project(self.core.complete(position, result, now))

    def fail(self, position: Position, error: BaseException, now: float) -> list[V3Output]:
        return self._project(self.core.fail(position, error, now))

    def prefilled(self, now: float) -> list[V3Output]:
        return self._project(self.core.prefilled(now))

    def prefill_failed(self, error: BaseException, now: float) -> list[V3Output]:
        return self._project(self.core.prefill_failed(error, now))

    def synthesis_done(self, job_id: str, pcm16: bytes, now: float) -> list[V3Output]:
        return self._project(self.core.synthesis_done(job_id, pcm16, now))

    def synthesis_failed(self, job_id: str, error: BaseException, now: float) -> list[V3Output]:
        return self._project(self.core.synthesis_failed(job_id, error, now))

    def disconnect(self, now: float) -> list[V3Output]:
        return self.core.disconnect(now)  # effects only: nothing is published on a disconnect

    # ================================================================ client events

    def _session_update(self, msg: dict, now: float) -> list[V3Output]:
        cid = _event_id(msg)
        if self.core.settings_locked or self.core.input_active:
            return [self._error("settings_locked", "session settings are locked after the first model input", cid)]
        session = msg.get("session", _MISSING)
        if not isinstance(session, dict):
            return [self._error("invalid_session_update", "session must be an object", cid)]
        version = session.get("protocol_version", _MISSING)
        version_ok = _is_int(version) and version == PROTOCOL["version"]
        if not self._configured_once and not version_ok:
            requested = None if version is _MISSING else version
            return self._project(
                self.core.abort_session(
                    "unsupported_protocol_version",
                    f"this server speaks voicechat.realtime version 3, not {requested!r}",
                    now,
                    client_event_id=cid,
                    details={"requested_version": requested},
                    closed=("failed", "unsupported_protocol_version"),
                )
            )
        if version is not _MISSING and not version_ok:
            return [
                self._error(
                    "unsupported_protocol_version",
                    f"protocol_version must be 3, not {version!r}",
                    cid,
                    requested_version=version,
                )
            ]
        mode = self._model_output_mode
        caps = session.get("capabilities", _MISSING)
        if caps is not _MISSING:
            if not isinstance(caps, dict):
                return [self._error("invalid_session_capabilities", "session.capabilities must be an object", cid)]
            requested_mode = caps.get("function_output_model_output")
            if requested_mode not in (None, MODEL_OUTPUT_MODE):
                return [
                    self._error(
                        "unsupported_session_capability",
                        f"function_output_model_output must be null or {MODEL_OUTPUT_MODE!r}",
                        cid,
                    )
                ]
            if self._configured_once and requested_mode != self._model_output_mode:
                return [self._error("settings_locked", "negotiated capabilities cannot change", cid)]
            mode = requested_mode
        current = self.core.prompt or SessionPrompt(self.options.default_instructions)
        instructions = session.get("instructions", _MISSING)
        if instructions is _MISSING:
            instructions = current.instructions
        elif instructions is None:
            instructions = self.options.default_instructions
        elif not isinstance(instructions, str):
            instructions = json.dumps(instructions) if isinstance(instructions, (dict, list)) else str(instructions)
        tools_value = session.get("tools", _MISSING)
        tools = current.tools
        if tools_value is not _MISSING:
            try:
                tools = normalize_tools([] if tools_value is None else tools_value)
            except InvalidTools as exc:
                return [self._error("invalid_tools", str(exc), cid)]
        self._model_output_mode = mode
        return self._project(self.core.receive(Configure(SessionPrompt(instructions, tools), cid), now))

    def _append(self, msg: dict, now: float) -> list[V3Output]:
        cid = _event_id(msg)
        if not self.core.configured:
            return [self._error("session_not_configured", "send session.update before audio", cid)]
        try:
            pcm = decode_append(msg)
        except AudioRejected as rejected:
            return [self._error(rejected.code, rejected.message, cid)]
        return self._project(self.core.receive(AppendAudio(pcm, cid, self._wire_bytes), now))

    def _barrier(self, msg: dict, now: float) -> list[V3Output]:
        event_id = msg.get("event_id")
        if not isinstance(event_id, str) or not event_id:
            return self._violation("invalid_event_id", "turn barriers require a non-empty string event_id", now, None)
        turn = msg.get("client_turn_id")
        if not _is_int(turn) or turn < 1:
            return self._violation(
                "invalid_client_turn_id", f"client_turn_id must be an integer >= 1, not {turn!r}", now, event_id
            )
        if msg["type"] == "input_audio_buffer.turn_start":
            return self._project(self.core.receive(StartTurn(turn, event_id, self._wire_bytes), now))
        # commit diagnostics are trace-only and never fail a turn
        return self._project(self.core.receive(CommitTurn(turn, event_id, self._wire_bytes), now))

    def _typed(self, msg: dict, now: float) -> list[V3Output]:
        return self._project(
            self.core.receive(RequestTypedInput(msg.get("job_id"), msg.get("text"), _event_id(msg)), now)
        )

    def _item_create(self, msg: dict, now: float) -> list[V3Output]:
        cid = _event_id(msg)
        item = msg.get("item")
        if not isinstance(item, dict) or item.get("type") != "function_call_output":
            return [self._error("invalid_conversation_item", "item must be a function_call_output object", cid)]
        if not (self.core.prompt and self.core.prompt.tools):
            return [self._error("tools_not_set", "no tools are configured for this session", cid)]
        command = SubmitFunctionOutput(
            call_id=item.get("call_id"),
            output=item.get("output"),
            model_output=item.get("model_output"),
            model_output_negotiated=self._model_output_mode == MODEL_OUTPUT_MODE,
            client_event_id=cid,
        )
        return self._project(self.core.receive(command, now))

    def _stop(self, msg: dict, now: float) -> list[V3Output]:
        return self._project(self.core.receive(Stop(_event_id(msg)), now))

    # ================================================================ outputs

    def _error(self, code: str, message: str, client_event_id: Any = None, **details: Any) -> WireEvent:
        return self.projector.error(code, message, False, client_event_id, **details)

    def _violation(self, code: str, message: str, now: float, client_event_id: str | None) -> list[V3Output]:
        return self._project(self.core.abort_session(code, message, now, client_event_id=client_event_id))

    def _project(self, outputs: list[ev.Output]) -> list[V3Output]:
        wire: list[V3Output] = []
        for o in outputs:
            if isinstance(o, ev.Effect):
                wire.append(o)
            elif isinstance(o, ev.SessionConfigured):
                self._configured_once = True
                wire.append(self.projector.session_updated(o, self._model_output_mode))
            else:
                wire.append(self.projector.project(o))
                if isinstance(o, ev.Error) and o.fatal and self._close_code is None:
                    self._close_code = close_code_for(o.code)
                elif isinstance(o, ev.SessionClosed) and self._close_code is None:
                    self._close_code = CLOSE_NORMAL
        if self.core.closed and not self._close_sent and self._close_code is not None:
            self._close_sent = True
            wire.append(CloseTransport(self._close_code))
        return wire


def _event_id(msg: dict) -> Any:
    value = msg.get("event_id")
    return value if isinstance(value, (str, int)) and not isinstance(value, bool) else None


_HANDLERS = {
    "session.update": V3Session._session_update,
    "input_audio_buffer.append": V3Session._append,
    "input_audio_buffer.turn_start": V3Session._barrier,
    "input_audio_buffer.commit": V3Session._barrier,
    "input_text.request": V3Session._typed,
    "conversation.item.create": V3Session._item_create,
    "session.stop": V3Session._stop,
}
