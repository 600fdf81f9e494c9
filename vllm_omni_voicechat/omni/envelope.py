"""What one model position carries into Stage 0 and how its audio is shaped (docs/omni-integration.md §2.2).

Pure (numpy only): the ``vc`` key our plugin adds to ``model_intermediate_buffer["duplex"]`` of each append,
and the PCM conversions between our 16 kHz PCM16 frames / 22.05 kHz PCM16 packets and vLLM-Omni's float32 audio.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..audio.frames import INPUT_FRAME_BYTES, INPUT_FRAME_SAMPLES
from ..errors import VoicechatError
from ..model.port import (
    AgentControl,
    AgentOutput,
    BoundaryPhase,
    FunctionState,
    PositionControls,
    ResponseBoundary,
    RnntEvidence,
    StepResult,
    StepTimings,
    ToolCall,
)

VC_KEY = "vc"
VC_VERSION = 1

TokenIds = Callable[[Sequence[str]], list[int]]


class EnvelopeError(VoicechatError, ValueError):
    """A position envelope that does not match what the port sent (a protocol bug between port and plugin)."""


class RequestFailed(EnvelopeError):
    """The thinker reported that this session's request failed (``{"failed": message}`` evidence): the session
    ends with the message, the engine and other sessions go on."""


def decode_controls(vc: dict) -> PositionControls:
    """The controls a thinker applies from a ``vc`` dict (tool results as the port's token strings)."""
    return PositionControls(
        eou_now=bool(vc.get("eou_now")),
        eou_at_fence=vc.get("eou_at_fence"),
        cancel_eou=bool(vc.get("cancel_eou")),
        agent_eos=bool(vc.get("agent_eos")),
        force_text_pad=bool(vc.get("force_text_pad")),
        tool_result_tokens=tuple(vc.get("tool_result_tokens") or ()),
        pre_eou=bool(vc.get("pre_eou")),
    )


def encode_controls(controls: PositionControls, *, position: int, synthetic: bool, token_ids: TokenIds) -> dict:
    """The ``vc`` dict of one position. ``reset`` is not sent: the port executes it (a new Stage-0 request)."""
    return {
        "v": VC_VERSION,
        "position": position,
        "synthetic": synthetic,
        "eou_now": controls.eou_now,
        "eou_at_fence": controls.eou_at_fence,
        "cancel_eou": controls.cancel_eou,
        "agent_eos": controls.agent_eos,
        "force_text_pad": controls.force_text_pad,
        "pre_eou": controls.pre_eou,
        "tool_result_token_ids": list(token_ids(controls.tool_result_tokens)) if controls.tool_result_tokens else [],
        "tool_result_tokens": list(controls.tool_result_tokens),
    }


def check_envelope(vc: Any, expected_position: int) -> dict:
    """Validate a ``vc`` dict popped for an append: the version and the position must be the ones expected."""
    if not isinstance(vc, dict) or vc.get("v") != VC_VERSION:
        raise EnvelopeError(f"not a v{VC_VERSION} position envelope: {vc!r}")
    if vc.get("position") != expected_position:
        raise EnvelopeError(f"envelope for position {vc.get('position')!r}, expected {expected_position}")
    return vc


def frame_to_f32(pcm16: bytes) -> np.ndarray:
    """One 80 ms input frame (1,280 PCM16 samples) as the float32 samples vLLM-Omni's append path takes."""
    if len(pcm16) != INPUT_FRAME_BYTES:
        raise EnvelopeError(f"a position frame is {INPUT_FRAME_BYTES} bytes, got {len(pcm16)}")
    out = np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0
    assert out.shape == (INPUT_FRAME_SAMPLES,)
    return out


def f32_to_pcm16(samples: np.ndarray) -> bytes:
    """Stage-2 float32 audio (nominally in [-1, 1]) as PCM16, clipped, rounded, little-endian."""
    x = np.nan_to_num(np.asarray(samples, dtype=np.float64), nan=0.0, posinf=1.0, neginf=-1.0)
    return np.round(np.clip(x, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


# --- the thinker's per-position evidence (what our thinker returns beside its token) -------------------------

EVIDENCE_KEY = "vc_step"


def encode_evidence(result: StepResult) -> dict:
    """A ``StepResult`` without its audio as plain data: the contract of our thinker's ``vc_step`` output key
    (the fake engine emits it from the simulator; our thinker, ``omni/thinker``, from the real model)."""
    return {
        "agent": {"control": result.agent.control.value, "token_id": result.agent.token_id, "delta": result.agent.delta},
        "rnnt": dataclasses.asdict(result.rnnt),
        "function": {f.name: getattr(result.function, f.name) for f in dataclasses.fields(result.function)},
        "tool_call": None if result.tool_call is None else dataclasses.asdict(result.tool_call),
        "boundary": {"phase": result.boundary.phase.value, "started": result.boundary.started,
                     "ended": result.boundary.ended, "reason": result.boundary.reason},
        "eou_consumed": result.eou_consumed,
        "fence_blank_count": result.fence_blank_count,
        "telemetry": dict(result.telemetry),
    }


def evidence_to_wire(evidence: dict) -> bytes:
    """The ``vc_step`` value as it crosses the engine: compact UTF-8 JSON bytes. vLLM-Omni's worker keeps only
    tensors in a step's multimodal output (``gpu_ar_model_runner._ensure_tensor_values`` drops a dict), so the
    thinker ships these bytes as a ``uint8`` tensor."""
    return json.dumps(evidence, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def evidence_from_wire(value: Any) -> dict:
    """The evidence dict from whatever reached the Stage-0 output metadata: the dict itself (CPU fakes), the JSON
    bytes, or a ``uint8`` tensor/array/list of them (a list of per-step values: the last one)."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, list | tuple) and value and not isinstance(value[0], int | np.integer):
        value = value[-1]
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
    else:
        if hasattr(value, "detach"):  # a torch tensor, without importing torch here
            value = value.detach().cpu().numpy()
        data = np.asarray(value).astype(np.uint8).reshape(-1).tobytes()
    try:
        text = data.rstrip(b"\0").decode("utf-8")
        # Several steps' bytes concatenated (an output path that accumulates a segment's tensors): the last wins.
        decoder, end, out = json.JSONDecoder(), 0, None
        while end < len(text):
            out, end = decoder.raw_decode(text, end)
    except (UnicodeDecodeError, ValueError) as exc:
        raise EnvelopeError(f"malformed {EVIDENCE_KEY} evidence bytes: {exc}") from exc
    if not isinstance(out, dict):
        raise EnvelopeError(f"{EVIDENCE_KEY} evidence is not an object")
    return out


def decode_step(evidence: Any, audio: bytes, inference_ms: float) -> StepResult:
    """Our ``StepResult`` from a position's ``vc_step`` evidence (any form :func:`evidence_from_wire` takes) and
    its aligned 80 ms audio packet (PCM16)."""
    evidence = evidence_from_wire(evidence)
    if evidence.get("failed"):
        raise RequestFailed(str(evidence["failed"]))
    try:
        agent = evidence["agent"]
        boundary = evidence["boundary"]
        call = evidence.get("tool_call")
        return StepResult(
            audio=audio,
            agent=AgentOutput(AgentControl(agent["control"]), agent.get("token_id"), agent.get("delta", "")),
            rnnt=RnntEvidence(**evidence["rnnt"]),
            function=FunctionState(**evidence["function"]),
            tool_call=None if call is None else ToolCall(**call),
            boundary=ResponseBoundary(BoundaryPhase(boundary["phase"]), boundary["started"], boundary["ended"],
                                      boundary.get("reason")),
            eou_consumed=bool(evidence.get("eou_consumed")),
            fence_blank_count=evidence.get("fence_blank_count"),
            timings=StepTimings(inference_ms=inference_ms),
            telemetry=dict(evidence.get("telemetry") or {}),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise EnvelopeError(f"malformed {EVIDENCE_KEY} evidence: {exc}") from exc
