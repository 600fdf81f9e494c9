"""The simulator model: a deterministic CPU stand-in for Nemotron VoiceChat behind the model port.

It "hears" simulator speech through a streaming decoder standing in for the RNNT (word-by-word transcript, blank
evidence on silence), opens a response on an explicit user EOU, speaks ``You said: <transcript>.`` one text
token per position with matching audio, closes with agent EOS and a short acoustic tail, and runs function-call
cycles on its function channel. Behaviours that break the protocol on purpose are selected per session through
:class:`SimBehaviour`.
"""

from __future__ import annotations

import enum
import json
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..audio.frames import INPUT_FRAME_BYTES, OUTPUT_FRAME_SAMPLES, SILENT_OUTPUT_FRAME
from ..audio.speech import SpeechDecoder, render_token_audio
from ..model.function_gate import FunctionGate
from ..model.port import (
    IDLE_FUNCTION,
    NO_CONTROLS,
    AgentControl,
    AgentOutput,
    BoundaryPhase,
    FunctionState,
    ModelError,
    PositionInput,
    ResponseBoundary,
    RnntEvidence,
    SessionPrompt,
    StepResult,
    StepTimings,
    ToolCall,
)
from ..model.prompt import (
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    parse_tool_call,
    render_system_prompt,
    tools_from_prompt,
)
from ..model.tokens import split_tokens
from .real_speech import Mouth, SphinxEar, check_available, token_schedule

SOTC = "<SPECIAL_20>"
EOTC = "<SPECIAL_21>"
EOTR = "<SPECIAL_22>"
TOKEN_IDS = {"pad": 12, "bos": 1, "eos": 2, "text": 1000}

_CALL_RE = re.compile(r"^\s*call\s+([A-Za-z_][A-Za-z0-9_-]{0,127})\s*(\{.*\})?\s*\.?\s*$", re.S)


@dataclass(frozen=True, slots=True)
class SimBehaviour:
    """Per-session behaviour of the simulator (defaults: a well-behaved model)."""

    reply_template: str = "You said: {transcript}."
    tool_reply_template: str = "The result is {output}."
    tail_positions: int = 3
    """Silent positions after agent EOS; the last one is the acoustic terminal."""
    never_reach_fence: bool = False
    """The RNNT never reports a blank (settlement cannot reach the fence)."""
    self_start_response_at: int | None = None
    """Open a response by itself (agent BOS) at this position index if it is listening."""
    self_start_function_at: int | None = None
    """Start a function cycle by itself at this position index if listening (a background worker: PAD forcing
    cannot stop it, so it shows up as pre-EOU function activity)."""
    sotc_on_eou: bool = False
    """With tools: the function head predicts SOTC on the EOU-consuming position. It is latched and replayed on the
    next position; the agent BOS is deferred until the call's result is through (then forced)."""
    function_head_sotc_at: int | None = None
    """The function head predicts SOTC at this position index (forced to PAD on pre-EOU positions)."""
    endless_response: bool = False
    """Keep speaking forever, ignoring agent EOS."""
    chained_calls: int = 1
    """Calls made in one turn before speaking the result (``call NAME {...}`` utterances)."""
    function_never_finishes: bool = False
    """After a result is injected, never emit EOTR."""
    step_delay_s: float = 0.0
    """Extra time each position takes (a slow model)."""
    prefill_delay_s: float = 0.0
    """Time the prefill takes (the model-ready barrier waits for it)."""
    legacy_turn_blanks: int | None = None
    """Diagnostic RNNT-owned mode: this many consecutive blanks after speech make the model take the turn."""
    fail_at_position: int | None = None
    """Raise a model failure on this position index."""
    fail_prefill: bool = False
    """Every prefill raises a model failure (after ``prefill_delay_s``): the model-ready barrier never completes."""
    stalled_response: str | None = None
    """A response that never says anything until EOS is requested: ``"silent"`` (PAD and digital silence) or
    ``"hum"`` (PAD with audible non-speech audio). The session's agent watchdogs end it."""
    ignore_eou: bool = False
    """Consume the user EOU but never open the agent turn (a broken EOU/BOS contract)."""
    skip_post_fc_bos: bool = False
    """Deferred-BOS case: never force the agent BOS after the call's result (a broken post-function contract)."""


class _Phase(enum.Enum):
    LISTENING = "listening"
    RESPONDING = "responding"
    TAIL = "tail"


class SimulatorModel:
    """Implements :class:`~vllm_omni_voicechat.model.port.ModelPort`."""

    def __init__(
        self,
        behaviour: SimBehaviour | None = None,
        *,
        real_speech: bool = False,
        sleep: Callable[[float], None] = time.sleep,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.behaviour = behaviour or SimBehaviour()
        self._listener_of: SimBehaviour | None = None  # the behaviour _listener_ok was worked out for
        self._listener_ok = False
        self.real_speech = real_speech
        """Hear with PocketSphinx and speak with eSpeak NG (``sim/real_speech.py``) instead of simulator speech."""
        self._ear: SphinxEar | None = None
        self._mouth = Mouth() if real_speech else None
        if real_speech:
            check_available()
        self._sleep = sleep
        self._timer = timer
        self.prompt = SessionPrompt()
        self.system_prompt = ""
        self.tools: tuple = ()
        self.prefills = 0
        self.prefills_failed = 0
        self.aborted = False
        self._reset_state()

    # --- port -------------------------------------------------------------------------------------------

    @property
    def inline_steps(self) -> bool:
        """A step takes microseconds unless a slow model is scripted: hosts may run it on their event loop."""
        return not self.behaviour.step_delay_s and not self.real_speech  # real speech: ~30 ms a position

    def prefill(self, prompt: SessionPrompt) -> None:
        if self.behaviour.prefill_delay_s:
            self._sleep(self.behaviour.prefill_delay_s)
        if self.behaviour.fail_prefill:
            self.prefills_failed += 1
            raise ModelError("simulated prefill failure")
        if self.real_speech and self._ear is None:
            self._ear = SphinxEar()  # its models take ~0.4 s to load: once per session, in the prefill
        self.prompt = prompt
        self.system_prompt = render_system_prompt(prompt)
        self.tools = tools_from_prompt(self.system_prompt)  # the simulator honours the rendered tool block
        self.prefills += 1
        self.aborted = False
        self._reset_state()

    def abort(self) -> None:
        self.aborted = True
        self._reset_state()

    def step(self, position: PositionInput) -> StepResult:
        t0 = self._timer()
        b = self.behaviour
        if len(position.pcm) != INPUT_FRAME_BYTES:
            raise ModelError(f"position input must be {INPUT_FRAME_BYTES} bytes, got {len(position.pcm)}")
        if b.fail_at_position is not None and self.positions == b.fail_at_position:
            raise ModelError(f"simulated model failure at position {self.positions}")
        if b.step_delay_s:
            self._sleep(b.step_delay_s)
        c = position.controls
        if c.reset:
            self._reset_state()
        index = self.positions
        self.positions += 1

        rnnt = self._hear(position.pcm)
        if (
            c is NO_CONTROLS
            and self._phase is _Phase.LISTENING
            and self._armed_fence is None
            and not (self._fn_emit or self._fn_awaiting or self._inject or self._fn_awaiting_eotr)
            and not self._force_bos_next
            and not self._gate.latch_pending
            and b is self._listener
        ):
            # Most positions of a conversation: listening, nothing armed or pending, a behaviour that starts nothing
            # by itself. What the steps below come to then, without walking them.
            telemetry = self._telemetry
            if telemetry is None:
                telemetry = self._telemetry = self._gate.telemetry()
            return StepResult(SILENT_OUTPUT_FRAME, _PAD, rnnt, IDLE_FUNCTION, None, _BOUNDARIES[BoundaryPhase.IDLE],
                              False, None, StepTimings((self._timer() - t0) * 1000.0), telemetry)
        if c.cancel_eou:
            self._armed_fence = None
        if c.eou_at_fence is not None:
            self._armed_fence = c.eou_at_fence
        for token in c.tool_result_tokens:
            self._inject.append(token)
        if c.agent_eos and self._phase is _Phase.RESPONDING and not b.endless_response:
            self._eos_requested = True

        eou, fence_count = self._eou_due(c.eou_now, rnnt)
        agent = _PAD
        audio = SILENT_OUTPUT_FRAME
        boundary_started = ended = False
        reason: str | None = None
        tools = bool(self.tools)
        raw_call: tuple[str, dict] | None = None  # a call the function head predicts to start here (SOTC)

        if eou:
            transcript, self._transcript = self._transcript, ""
            if b.sotc_on_eou and tools:
                # The function head predicts SOTC on the EOU-consuming position: the gate stages it, the agent
                # turn is deferred and BOS is forced once the call's result is through.
                raw_call = self._call_for(transcript) or self._first_tool_call()
                self._post_fc_bos = True
                self._phase = _Phase.RESPONDING
                self._reply = deque()
            elif not b.ignore_eou:
                agent = AgentOutput(AgentControl.AGENT_BOS, TOKEN_IDS["bos"])
                boundary_started = True
                self._open_response(transcript)
        elif self._force_bos_next:
            self._force_bos_next = False
            agent = AgentOutput(AgentControl.AGENT_BOS, TOKEN_IDS["bos"])
            boundary_started = True
        elif self._phase is _Phase.LISTENING:
            if index == b.self_start_response_at:
                agent = AgentOutput(AgentControl.AGENT_BOS, TOKEN_IDS["bos"])
                boundary_started = True
                self._phase = _Phase.RESPONDING
                self._say("Hello there.")
            elif index == b.self_start_function_at and self._fn_idle:
                self._begin_cycle(self._first_tool_call())  # not a head prediction: the gate cannot stop it
            elif index == b.function_head_sotc_at and self._fn_idle:
                raw_call = self._first_tool_call()
        elif self._phase is _Phase.RESPONDING:
            if self._fn_idle and self._next_call is not None and not self._gate.latch_pending:
                raw_call, self._next_call = self._next_call, None
            elif self._fn_idle and not self._gate.latch_pending:
                agent, audio = self._speak(c.force_text_pad)
        elif self._phase is _Phase.TAIL:
            self._tail_left -= 1
            if self._tail_left <= 0:
                ended, reason = True, "post_eos_audio_silence"
                self._phase = _Phase.LISTENING

        fn_token: str | None = None
        tool_call: ToolCall | None = None
        if raw_call is not None or (self._gate.latch_pending and not eou):
            effective = self._gate.admit(SOTC if raw_call else None, frame=index, pre_eou=c.pre_eou, eou_position=eou)
            self._telemetry = None
            if effective == SOTC:
                self._begin_cycle(self._latched_call or raw_call or self._first_tool_call())
                self._pending_call = self._pending_call or self._latched_call
                self._latched_call = None
                fn_token = self._fn_emit.popleft()
            elif self._gate.latch_pending:
                self._latched_call = raw_call
        else:
            fn_token, tool_call = self._function_step()
        fn_state = self._function_state(fn_token)

        state = self._phase  # identity tests: an Enum member hashes (a dict lookup) and gives .value in Python
        if state is _Phase.LISTENING:
            phase = BoundaryPhase.IDLE
        elif state is _Phase.RESPONDING:
            phase = BoundaryPhase.RESPONDING
        else:
            phase = BoundaryPhase.TAIL_DRAINING
        if ended:
            phase = BoundaryPhase.COMPLETE
        if agent.control is AgentControl.AGENT_EOS and self.behaviour.tail_positions <= 0:
            ended, reason, phase = True, "post_eos_audio_silence", BoundaryPhase.COMPLETE
            self._phase = _Phase.LISTENING
        if boundary_started or ended:
            boundary = ResponseBoundary(phase, boundary_started, ended, reason)
        else:
            boundary = _BOUNDARIES[phase]  # most positions: a shared value
        telemetry = self._telemetry
        if telemetry is None:  # the gate's counts change only when it admits a token: one dict until then
            telemetry = self._telemetry = self._gate.telemetry()
        return StepResult(
            audio,
            agent,
            rnnt,
            fn_state,
            tool_call,
            boundary,
            eou,
            fence_count,
            StepTimings((self._timer() - t0) * 1000.0),
            telemetry,
        )

    # --- listening ----------------------------------------------------------------------------------------

    def _reset_state(self) -> None:
        self.positions = 0
        if self.real_speech:
            if self._ear is not None:
                self._ear.reset()
            self._decoder = self._ear  # made by the prefill, off the event loop
        else:
            self._decoder = SpeechDecoder(16_000)
        self._blank_count = 0
        self._transcript = ""
        self._armed_fence: int | None = None
        self._phase = _Phase.LISTENING
        self._reply: deque[str] = deque()
        self._voice: deque[bytes] = deque()  # real speech: the reply's audio frames still to go out
        self._schedule: deque[int] = deque()  # real speech: how many text tokens go out with each of them
        self._eos_requested = False
        self._tail_left = 0
        self._heard_speech = False
        # function channel
        self._fn_emit: deque[str] = deque()
        self._fn_payload = ""
        self._fn_awaiting = False
        self._inject: deque[str] = deque()
        self._injected: list[str] = []
        self._fn_awaiting_eotr = False
        self._calls_this_turn = 0
        self._pending_call: tuple[str, dict] | None = None
        self._next_call: tuple[str, dict] | None = None
        self._latched_call: tuple[str, dict] | None = None
        self._post_fc_bos = False
        self._force_bos_next = False
        self._gate: FunctionGate[str] = FunctionGate(SOTC)
        self._telemetry: dict | None = None
        """The gate's telemetry since it last admitted a token (shared by those positions' results: read-only)."""

    def _hear(self, pcm: bytes) -> RnntEvidence:
        if self._decoder is None:  # real speech stepped before any prefill
            self._ear = self._decoder = SphinxEar()
        step = self._decoder.feed(pcm)
        delta = "".join(step.pieces)
        # Blank means "no speech energy on this frame": a word whose end is only recognised on the following
        # silent frame does not reset the count, so the fence measures silence after the speech.
        blank = not step.energetic
        if self.behaviour.never_reach_fence:
            blank = False
        self._blank_count = self._blank_count + 1 if blank else 0
        if delta and self.real_speech and self._transcript:
            delta = " " + delta  # the ear's utterances are bare words
        if delta:
            self._transcript += delta
            if self._mouth is not None:  # the echo is known now; the turn ends at least a fence later
                self._mouth.prepare(_reply_text(self.behaviour.reply_template, self._transcript.strip()))
        if not blank:
            self._heard_speech = True
        return RnntEvidence(blank, self._blank_count, delta, bool(delta) or step.energetic)

    def _eou_due(self, eou_now: bool, rnnt: RnntEvidence) -> tuple[bool, int | None]:
        if self._phase is not _Phase.LISTENING or not self._fn_idle:
            return False, None
        if eou_now:
            self._armed_fence = None
            return True, None
        if self._armed_fence is not None and rnnt.blank_count >= self._armed_fence:
            self._armed_fence = None
            return True, rnnt.blank_count
        n = self.behaviour.legacy_turn_blanks
        if n is not None and self._heard_speech and self._transcript and rnnt.blank_count >= n:
            return True, None
        return False, None

    # --- responding ---------------------------------------------------------------------------------------

    def _open_response(self, transcript: str) -> None:
        self._phase = _Phase.RESPONDING
        self._eos_requested = False
        self._calls_this_turn = 0
        call = self._call_for(transcript)
        if call is not None:
            self._pending_call = call
            self._next_call = call  # the function head predicts it on the first post-BOS position
            self._reply = deque()
        else:
            self._say(_reply_text(self.behaviour.reply_template, transcript.strip()))

    def _say(self, text: str) -> None:
        """The reply to speak: its text tokens, and with real speech its audio frames and their tokens' schedule."""
        self._reply = deque(split_tokens(text))
        if self._mouth is not None:
            self._voice = deque(self._mouth.frames(text))
            self._schedule = deque(token_schedule(len(self._reply), len(self._voice)))

    def _speak(self, force_pad: bool) -> tuple[AgentOutput, bytes]:
        stalled = self.behaviour.stalled_response is not None
        done = not self._reply and not self._voice
        if self._eos_requested or (done and not self.behaviour.endless_response and not stalled):
            self._eos_requested = False
            self._reply.clear()
            self._voice.clear()
            self._schedule.clear()
            self._phase = _Phase.TAIL
            self._tail_left = self.behaviour.tail_positions
            return AgentOutput(AgentControl.AGENT_EOS, TOKEN_IDS["eos"]), SILENT_OUTPUT_FRAME
        if force_pad:
            return _PAD, SILENT_OUTPUT_FRAME
        if self.behaviour.stalled_response == "silent":
            return _PAD, SILENT_OUTPUT_FRAME
        if self.behaviour.stalled_response == "hum":
            return _PAD, _HUM
        if done:  # endless: keep talking
            if self.real_speech:
                self._say("and more")
            else:
                self._reply.extend(split_tokens(" and more"))
        if self._voice:
            audio = self._voice.popleft()
            text = "".join(self._reply.popleft() for _ in range(self._schedule.popleft()))
            if not text:
                return _PAD, audio
            return AgentOutput(AgentControl.TEXT, TOKEN_IDS["text"], text), audio
        token = self._reply.popleft()
        audio = render_token_audio(token, 22_050, OUTPUT_FRAME_SAMPLES)
        return AgentOutput(AgentControl.TEXT, TOKEN_IDS["text"], token), audio

    @property
    def _listener(self) -> SimBehaviour | None:
        """The behaviour when it starts nothing on a listening position by itself (no scripted start, no
        diagnostic turn taking, no blank-free ear), else None; recomputed when the behaviour is replaced."""
        b = self.behaviour
        if self._listener_of is not b:
            self._listener_of = b
            self._listener_ok = (b.self_start_response_at is None and b.self_start_function_at is None
                                 and b.function_head_sotc_at is None and b.legacy_turn_blanks is None)
        return b if self._listener_ok else None

    # --- function channel ---------------------------------------------------------------------------------

    @property
    def _fn_idle(self) -> bool:
        return not (self._fn_emit or self._fn_awaiting or self._inject or self._fn_awaiting_eotr)

    def _tool_names(self) -> dict[str, str]:
        return {t.name.replace("-", "_"): t.name for t in self.tools}

    def _call_for(self, transcript: str) -> tuple[str, dict] | None:
        m = _CALL_RE.match(transcript)
        if not m:
            return self._spoken_call(transcript) if self.real_speech else None
        names = self._tool_names()
        name = names.get(m.group(1).replace("-", "_"))
        if name is None:
            return None
        try:
            args = json.loads(m.group(2)) if m.group(2) else {}
        except json.JSONDecodeError:
            return None
        return (name, args) if isinstance(args, dict) else None

    def _spoken_call(self, transcript: str) -> tuple[str, dict] | None:
        """Real speech: an utterance that says a tool's name (``local_time``: "what is the local time") calls it,
        with no arguments (JSON cannot be said aloud; the recogniser rarely hears the word "call")."""
        heard = f" {' '.join(re.findall(r'[a-z0-9]+', transcript.lower()))} "
        for tool in self.tools:
            spoken = " ".join(re.findall(r"[a-z0-9]+", tool.name.lower().replace("_", " ").replace("-", " ")))
            if spoken and f" {spoken} " in heard:
                return tool.name, {}
        return None

    def _first_tool_call(self) -> tuple[str, dict]:
        name = self.tools[0].name if self.tools else "lookup"
        return name, {}

    def _begin_cycle(self, call: tuple[str, dict]) -> None:
        name, args = call
        payload = "<TOOLCALL>" + json.dumps([{"name": name, "arguments": args}], separators=(",", ":")) + "</TOOLCALL>"
        self._fn_emit = deque([SOTC, *split_tokens(payload, 4), EOTC])
        self._fn_payload = ""
        self._calls_this_turn += 1

    def _function_step(self) -> tuple[str | None, ToolCall | None]:
        if self._fn_emit:
            token = self._fn_emit.popleft()
            if token not in (SOTC, EOTC):
                self._fn_payload += token
            if token == EOTC:
                self._fn_awaiting = True
                return token, parse_tool_call(self._fn_payload)
            return token, None
        if self._inject:
            self._fn_awaiting = False
            token = self._inject.popleft()
            self._injected.append(token)
            if not self._inject:
                self._fn_awaiting_eotr = True
                if self._mouth is not None:  # the answer is known a position before it is due
                    output = _unwrap_result("".join(self._injected))
                    self._mouth.prepare(self.behaviour.tool_reply_template.format(output=output))
            return token, None
        if self._fn_awaiting_eotr and not self.behaviour.function_never_finishes:
            # EOTR ends the cycle on this position; whatever follows (a chained call, the answer, a forced
            # BOS) starts on the next one, so the cycle boundary is clean.
            self._fn_awaiting_eotr = False
            output = _unwrap_result("".join(self._injected))
            self._injected = []
            self._phase = _Phase.RESPONDING
            if self._pending_call is not None and self._calls_this_turn < self.behaviour.chained_calls:
                self._next_call = self._pending_call
            else:
                self._pending_call = None
                self._say(self.behaviour.tool_reply_template.format(output=output))
                if self._post_fc_bos:
                    self._post_fc_bos = False
                    self._force_bos_next = not self.behaviour.skip_post_fc_bos
            return EOTR, None
        return None, None

    def _function_state(self, token: str | None) -> FunctionState:
        latched = self._gate.latch_pending
        if self._fn_idle and token is None and not self._force_bos_next and not latched:
            return IDLE_FUNCTION
        return FunctionState(
            token=token,
            raw_token=token,
            active=bool(self._fn_emit),
            awaiting_result=self._fn_awaiting,
            injecting=bool(self._inject),
            awaiting_eotr=self._fn_awaiting_eotr,
            forced_tokens=len(self._inject),
            post_fc_bos_pending=self._force_bos_next or self._post_fc_bos,
            latched=latched,
        )


_PAD = AgentOutput(AgentControl.PAD, TOKEN_IDS["pad"])
_BOUNDARIES = {phase: ResponseBoundary(phase) for phase in BoundaryPhase}
"""The boundary of a position that neither starts nor ends a response, by phase."""

_HUM = (np.sin(np.arange(OUTPUT_FRAME_SAMPLES) * (2 * np.pi * 150 / 22_050)) * 3000).astype("<i2").tobytes()


GREETING = "Hello! How can I help?"
"""What the simulator says to a turn it heard nothing in (asked to speak first, or a commit of nothing)."""


def _reply_text(template: str, transcript: str) -> str:
    if not transcript.strip():
        return GREETING
    text = template.format(transcript=transcript)
    # "You said: Is it?." reads badly: keep the transcript's own final punctuation.
    if transcript[-1:] in (".", "!", "?") and text.endswith(transcript + "."):
        text = text[:-1]
    return text


def _unwrap_result(text: str) -> str:
    body = text
    if body.startswith(TOOL_RESPONSE_OPEN) and body.endswith(TOOL_RESPONSE_CLOSE):
        body = body[len(TOOL_RESPONSE_OPEN) : -len(TOOL_RESPONSE_CLOSE)]
    try:
        value = json.loads(body)
    except ValueError:
        return body
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
