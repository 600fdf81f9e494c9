"""One request's control state on the thinker: what the runtime's controls do to the text and function channels.

Torch-free and model-free. Per position the thinker calls :meth:`ThinkerSession.begin` before the forward (with
the position's ``vc`` controls and RNNT evidence: everything that decides *forcing* is known then), and
:meth:`ThinkerSession.finish` with the raw greedy text and function-head ids after it. ``finish`` returns the
effective ids (what is sampled and fed back into the next position's fusion) and the position's
:class:`~vllm_omni_voicechat.model.port.StepResult` without audio: the ``vc_step`` evidence is its
``envelope.encode_evidence``, so the adapter decodes exactly what the simulator would have produced.

Channel rules (model.md §3-§6, v3-contract §7; the simulator in ``sim/model.py`` is the behavioural reference):

* **User EOU** (``eou_now``, or an armed ``eou_at_fence`` once the RNNT blank count reaches it) is consumed only
  while the agent is idle and the function channel is idle; the consuming position forces agent **BOS** (EOU and
  BOS fused on one position). An armed fence stays armed until it fires or ``cancel_eou``.
* **Agent EOS** (``agent_eos``) is latched while a response is open and forced on the first position it can be;
  ``tail_positions`` positions later the response's acoustic terminal is reported (``boundary.ended``).
* **PAD forcing**: ``force_text_pad`` forces the text channel to PAD; injection positions hold it at PAD too.
* **Function channel**: ``model/function_gate.py`` applies pre-EOU PAD forcing and the one-token SOTC latch on
  the raw function-head id; SOTC ... EOTC is a call (its payload decoded and parsed at EOTC); queued tool-result
  ids are force-fed one per position once the call is complete, then EOTR (the reference appends it).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ...model.function_gate import FunctionGate
from ...model.port import (
    AgentControl,
    AgentOutput,
    BoundaryPhase,
    FunctionState,
    PositionControls,
    ResponseBoundary,
    RnntEvidence,
    StepResult,
    ToolCall,
)
from ...model.prompt import parse_tool_call

DEFAULT_TAIL_POSITIONS = 3
"""Positions from the forced/predicted agent EOS to the response's acoustic terminal (the talker's tail)."""

DecodeToken = Callable[[int], str]


@dataclass(frozen=True, slots=True)
class SpecialIds:
    pad: int
    bos: int
    eos: int
    sotc: int
    eotc: int
    eotr: int

    @classmethod
    def from_runtime(cls, runtime: Mapping[str, object]) -> SpecialIds:
        """From the session's runtime config (the ``nvc_*`` ids the plugin resolved from the tokenizer)."""
        try:
            return cls(*(int(runtime[k]) for k in (  # type: ignore[call-overload]
                "nvc_text_pad_id", "nvc_text_bos_id", "nvc_text_eos_id",
                "nvc_function_sotc_id", "nvc_function_eotc_id", "nvc_function_eotr_id")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"voicechat thinker: runtime config lacks the special token ids ({exc})") from exc


class _Phase(enum.Enum):
    IDLE = "idle"
    RESPONDING = "responding"
    TAIL = "tail"


@dataclass(frozen=True, slots=True)
class PositionPlan:
    """What :meth:`ThinkerSession.begin` decided for one position before the forward."""

    frame: int
    """The absolute model position (the port's counter; it survives epochs)."""
    controls: PositionControls
    rnnt: RnntEvidence
    eou: bool
    fence_blank_count: int | None
    forced_text: int | None
    """The text id to sample instead of the model's (None: the model's greedy id)."""
    forced_function: int | None
    """The function id to feed instead of the head's (None: the head's id through the gate)."""


class ThinkerSession:
    def __init__(self, ids: SpecialIds, decode: DecodeToken, *, tail_positions: int = DEFAULT_TAIL_POSITIONS,
                 append_eotr: bool = True) -> None:
        self.ids = ids
        self.decode = decode
        self.tail_positions = tail_positions
        self.append_eotr = append_eotr
        self.reset()

    def reset(self) -> None:
        self.positions = 0
        self._phase = _Phase.IDLE
        self._armed_fence: int | None = None
        self._eos_requested = False
        self._tail_left = 0
        self._active = False
        self._payload = ""
        self._awaiting_result = False
        self._inject: deque[int] = deque()
        self._awaiting_eotr = False
        self._plan: PositionPlan | None = None
        self.gate: FunctionGate[int] = FunctionGate(self.ids.sotc, self.ids.pad)
        self.counters = {"text_pad_forced": 0, "agent_eos_forced": 0, "agent_bos_forced": 0, "tool_tokens_injected": 0}
        self.edges: dict[str, int | None] = {"last_eou_frame": None, "last_eos_forced_frame": None,
                                             "last_pad_forced_frame": None, "last_injection_frame": None}

    @property
    def function_idle(self) -> bool:
        return not (self._active or self._awaiting_result or self._inject or self._awaiting_eotr
                    or self.gate.latch_pending)

    # --- before the forward -------------------------------------------------------------------------------------

    def begin(self, controls: PositionControls, rnnt: RnntEvidence, *, frame: int | None = None,
              tool_result_ids: Sequence[int] = ()) -> PositionPlan:
        if self._plan is not None:
            raise RuntimeError("voicechat thinker: a position began before the previous one finished")
        frame = self.positions if frame is None else frame
        ids = self.ids
        if controls.cancel_eou:
            self._armed_fence = None
        if controls.eou_at_fence is not None:
            self._armed_fence = controls.eou_at_fence
        self._inject.extend(tool_result_ids)
        if controls.agent_eos and self._phase is _Phase.RESPONDING:
            self._eos_requested = True

        eou, fence_count = False, None
        if self._phase is _Phase.IDLE and self.function_idle:
            if controls.eou_now:
                eou, self._armed_fence = True, None
            elif self._armed_fence is not None and rnnt.blank_count >= self._armed_fence:
                eou, fence_count, self._armed_fence = True, rnnt.blank_count, None

        injecting = bool(self._inject) and not self._active
        forced_function: int | None = None
        if injecting:
            forced_function = self._inject[0]
        elif self._awaiting_eotr and self.append_eotr:
            forced_function = ids.eotr

        forced_text: int | None = None
        if eou:
            forced_text = ids.bos
        elif injecting or forced_function == ids.eotr:
            forced_text = ids.pad  # the text channel is held while the result goes in
        elif self._eos_requested and self._phase is _Phase.RESPONDING:
            forced_text = ids.eos
        elif controls.force_text_pad:
            forced_text = ids.pad
        self._plan = PositionPlan(frame, controls, rnnt, eou, fence_count, forced_text, forced_function)
        return self._plan

    # --- after the forward --------------------------------------------------------------------------------------

    def finish(self, raw_text: int, raw_function: int) -> tuple[int, int, StepResult]:
        plan, self._plan = self._plan, None
        if plan is None:
            raise RuntimeError("voicechat thinker: finish without begin")
        self.positions += 1
        ids = self.ids
        text = raw_text if plan.forced_text is None else plan.forced_text
        if plan.forced_text is not None and plan.forced_text != raw_text:
            self._count_forced(plan.forced_text, plan.frame)
        if plan.eou:
            self.edges["last_eou_frame"] = plan.frame

        started = ended = False
        reason: str | None = None
        if self._phase is _Phase.TAIL:
            self._tail_left -= 1
            if text in (ids.bos, ids.eos):
                text = ids.pad  # no new boundary while the last one drains
            if self._tail_left <= 0:
                ended, reason, self._phase = True, "post_eos_audio_silence", _Phase.IDLE
        elif text == ids.bos:
            if self._phase is _Phase.IDLE:
                started, self._phase, self._eos_requested = True, _Phase.RESPONDING, False
            else:
                text = ids.pad
        elif text == ids.eos:
            if self._phase is _Phase.RESPONDING:
                self._eos_requested = False
                self._phase, self._tail_left = _Phase.TAIL, self.tail_positions
                if self.tail_positions <= 0:
                    ended, reason, self._phase = True, "post_eos_audio_silence", _Phase.IDLE
            else:
                text = ids.pad  # EOS while listening says nothing

        if text == ids.pad:
            agent = AgentOutput(AgentControl.PAD, text)
        elif text == ids.bos:
            agent = AgentOutput(AgentControl.AGENT_BOS, text)
        elif text == ids.eos:
            agent = AgentOutput(AgentControl.AGENT_EOS, text)
        else:
            agent = AgentOutput(AgentControl.TEXT, text, self.decode(text))

        function, tool_call, fn = self._function(plan, raw_function)
        if ended:
            phase = BoundaryPhase.COMPLETE
        else:
            phase = {_Phase.IDLE: BoundaryPhase.IDLE, _Phase.RESPONDING: BoundaryPhase.RESPONDING,
                     _Phase.TAIL: BoundaryPhase.TAIL_DRAINING}[self._phase]
        result = StepResult(
            audio=b"",
            agent=agent,
            rnnt=plan.rnnt,
            function=function,
            tool_call=tool_call,
            boundary=ResponseBoundary(phase, started, ended, reason),
            eou_consumed=plan.eou,
            fence_blank_count=plan.fence_blank_count,
            telemetry={**self.gate.telemetry(), **self.counters, **self.edges, "thinker_frame": plan.frame},
        )
        return text, fn, result

    def _function(self, plan: PositionPlan, raw: int) -> tuple[FunctionState, ToolCall | None, int]:
        ids = self.ids
        call: ToolCall | None = None
        if plan.forced_function is not None:
            fn = plan.forced_function
            if fn == ids.eotr and not self._inject:
                self._awaiting_eotr = False  # the cycle is over on this position
            else:
                self._inject.popleft()
                self._awaiting_result = False
                self.counters["tool_tokens_injected"] += 1
                self.edges["last_injection_frame"] = plan.frame
                if not self._inject:
                    self._awaiting_eotr = True
        else:
            fn = self.gate.admit(raw, frame=plan.frame, pre_eou=plan.controls.pre_eou, eou_position=plan.eou)
            fn = ids.pad if fn is None else fn
            if self._active:
                if fn == ids.eotc:
                    self._active, self._awaiting_result = False, True
                    call = parse_tool_call(self._payload)
                elif fn != ids.pad:
                    self._payload += self.decode(fn)
            elif fn == ids.sotc:
                self._active, self._payload = True, ""
            elif fn == ids.eotr and self._awaiting_eotr:
                self._awaiting_eotr = False
        state = FunctionState(
            token=None if fn == ids.pad else self.decode(fn),
            raw_token=None if raw == ids.pad else self.decode(raw),
            active=self._active,
            awaiting_result=self._awaiting_result,
            injecting=bool(self._inject),
            awaiting_eotr=self._awaiting_eotr,
            forced_tokens=len(self._inject),
            latched=self.gate.latch_pending,
        )
        return state, call, fn

    def _count_forced(self, token: int, frame: int) -> None:
        ids = self.ids
        if token == ids.pad:
            self.counters["text_pad_forced"] += 1
            self.edges["last_pad_forced_frame"] = frame
        elif token == ids.eos:
            self.counters["agent_eos_forced"] += 1
            self.edges["last_eos_forced_frame"] = frame
        elif token == ids.bos:
            self.counters["agent_bos_forced"] += 1
