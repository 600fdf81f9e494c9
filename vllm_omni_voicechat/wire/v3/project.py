"""Native events -> v3 wire events (dicts ready for JSON), 1:1, with the v3 envelope."""

from __future__ import annotations

from typing import Any

import pybase64

from ...audio.frames import OUTPUT_SAMPLE_RATE
from ...session import events as ev
from ...session.tools import tool_to_dict
from ..limits import bounded_message
from .schema import PROTOCOL, audio_formats

WireEvent = dict[str, Any]


class V3Projector:
    """Stamps ``type``, ``event_id`` (``evt_<session>_<n>``) and ``session_id`` on every event."""

    def __init__(self, session_id: str, capabilities: dict[str, Any]) -> None:
        self.session_id = session_id
        self.capabilities = capabilities
        self._seq = 0

    def envelope(self, type_: str, **fields: Any) -> WireEvent:
        return {"type": type_, "event_id": self._event_id(), "session_id": self.session_id, **fields}

    def _event_id(self) -> str:
        self._seq += 1
        return f"evt_{self.session_id}_{self._seq}"

    def error(self, code: str, message: str, fatal: bool, client_event_id: Any = None, **details: Any) -> WireEvent:
        body: dict[str, Any] = {"code": code, "message": bounded_message(message), "fatal": fatal}
        if client_event_id is not None:
            body["client_event_id"] = client_event_id
        body.update(details)
        return self.envelope("error", error=body)

    def session_updated(self, event: ev.SessionConfigured, model_output_mode: str | None) -> WireEvent:
        return self.envelope(
            "session.updated",
            protocol=dict(PROTOCOL),
            capabilities=self.capabilities,
            session={
                "id": self.session_id,
                "protocol_version": PROTOCOL["version"],
                "instructions": event.prompt.instructions,
                "tools": [tool_to_dict(t) for t in event.prompt.tools],
                **audio_formats(),
                "capabilities": {"function_output_model_output": model_output_mode},
            },
        )

    def project(self, e: ev.NativeEvent) -> WireEvent:  # noqa: C901 - one branch per event type
        env = self.envelope
        match e:
            case ev.PositionMetrics():  # every position: the envelope written out (no keyword dict to merge)
                return {
                    "type": "voicechat.metrics",
                    "event_id": self._event_id(),
                    "session_id": self.session_id,
                    "frame": e.frame,
                    "transport_frame": e.transport_frame,
                    "inference_ms": e.inference_ms,
                    "server_step_ms": e.server_step_ms,
                    "budget_ms": e.budget_ms,
                    "over_budget": e.over_budget,
                    "input_audio": e.input_audio,
                    "output_audio": e.output_audio,
                    "model_output_audio": e.output_audio,
                    "audio_delivered": e.audio_delivered,
                    "turn_state": {"kind": e.kind, **e.turn_state},
                    "turn_id": e.turn_id,
                    "response_id": e.response_id,
                    "step9_capture_fallback": False,
                }
            case ev.AudioDelta():
                return {
                    "type": "response.output_audio.delta",
                    "event_id": self._event_id(),
                    "session_id": self.session_id,
                    "turn_id": e.turn_id,
                    "response_id": e.response_id,
                    "delta": pybase64.b64encode(e.pcm).decode("ascii"),
                    "encoding": "pcm16",
                    "sample_rate": OUTPUT_SAMPLE_RATE,
                    "channels": 1,
                }
            case ev.TextDelta():
                return env("response.output_text.delta", turn_id=e.turn_id, response_id=e.response_id, delta=e.delta, text=e.text)
            case ev.TranscriptDelta():
                return env(
                    "conversation.item.input_audio_transcription.delta",
                    turn_id=e.turn_id,
                    delta=e.delta,
                    transcript=e.transcript,
                    source=e.source,
                    job_id=e.job_id,
                )
            case ev.SpeechStarted():
                return env(
                    "input_audio_buffer.speech_started",
                    turn_id=e.turn_id,
                    source=e.source,
                    job_id=e.job_id,
                    correlation=e.correlation if e.correlation != "" else None,  # legacy: no client turn
                )
            case ev.TurnStarted():
                return env(
                    "input_audio_buffer.turn_started",
                    client_event_id=e.client_event_id,
                    client_turn_id=e.client_turn_id,
                    turn_id=e.turn_id,
                )
            case ev.TurnCommitted():
                return env(
                    "input_audio_buffer.committed",
                    client_event_id=e.client_event_id,
                    client_turn_id=e.client_turn_id,
                    turn_id=e.turn_id,
                )
            case ev.SpeechStopped():
                return env("input_audio_buffer.speech_stopped", turn_id=e.turn_id, source=e.source, job_id=e.job_id)
            case ev.TranscriptCompleted():
                return env(
                    "conversation.item.input_audio_transcription.completed",
                    turn_id=e.turn_id,
                    transcript=e.transcript,
                    empty=e.empty,
                    source=e.source,
                    job_id=e.job_id,
                )
            case ev.ResponseCreated():
                return env("response.created", turn_id=e.turn_id, response_id=e.response_id)
            case ev.TextDone():
                return env("response.output_text.done", turn_id=e.turn_id, response_id=e.response_id, text=e.text, empty=e.empty)
            case ev.AudioDone():
                return env("response.output_audio.done", turn_id=e.turn_id, response_id=e.response_id, empty=e.empty)
            case ev.ResponseDone():
                return env("response.done", turn_id=e.turn_id, response_id=e.response_id, status=e.status, reason=e.reason)
            case ev.FunctionCallPublished():
                return env(
                    "response.function_call_arguments.done",
                    turn_id=e.turn_id,
                    response_id=e.response_id,
                    call_id=e.call_id,
                    name=e.name,
                    arguments=e.arguments,
                )
            case ev.FunctionCallFailed():
                return env(
                    "response.function_call.failed",
                    turn_id=e.turn_id,
                    response_id=e.response_id,
                    call_id=e.call_id,
                    reason=e.reason,
                )
            case ev.FunctionOutputApplied():
                return env("conversation.item.function_call_output.applied", call_id=e.call_id)
            case ev.TypedAccepted():
                return env("input_text.accepted", job_id=e.job_id)
            case ev.TypedRejected():
                return env("input_text.rejected", job_id=e.job_id, reason=e.reason)
            case ev.TypedInjectionStarted():
                return env("input_text.injection_started", job_id=e.job_id)
            case ev.TypedInjectionFinished():
                return env("input_text.injection_finished", job_id=e.job_id, disposition=e.disposition)
            case ev.Error():
                return self.error(e.code, e.message, e.fatal, e.client_event_id, **e.details)
            case ev.SessionClosed():
                return env("session.closed", status=e.status, reason=e.reason)
        raise TypeError(f"no v3 projection for {e!r}")
