"""The voicechat session core: a sans-I/O state machine over the Stage 0 runner.

Inputs: client commands (``receive``), model step results (``complete`` / ``fail``), shell completions
(``prefilled``, ``synthesis_done`` ...) and clock ticks (``poll``), each with an injected ``now``. Outputs: an
ordered list of native events and effects. The shell loop is::

    tick = core.poll(now)            # outputs, maybe a position to run, maybe a wake-up time
    result = model.step(tick.position.input)           # off the event loop
    outputs = core.complete(tick.position, result, now)

Client barriers are ordered with the audio around them in one work queue; each queue item runs as a procedure
(a generator that yields position plans and receives their step results), so multi-position sequences such as
cancel tail -> turn start, or settlement -> fused EOU/BOS, read top to bottom.
"""

from __future__ import annotations

import dataclasses
import inspect
import uuid
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from ..audio.frames import INPUT_FRAME_BYTES, SILENT_INPUT_FRAME, FrameAssembler
from ..model.prompt import wrap_tool_result
from ..model.tokens import split_tokens
from ..model.port import (
    NO_CONTROLS,
    AgentControl,
    BoundaryPhase,
    PositionControls,
    SessionPrompt,
    StepResult,
)
from ..runner.stage0 import (
    DEFAULT_MAX_SESSION_MODEL_FRAMES,
    Position,
    PositionKind,
    PositionLimitReached,
    Stage0Runner,
    StepMetrics,
)
from .commands import (
    AppendAudio,
    Command,
    CancelResponse,
    ClearInput,
    CommitInput,
    CommitTurn,
    Configure,
    RequestTypedInput,
    RespondNow,
    StartTurn,
    Stop,
    SubmitFunctionOutput,
)
from .events import (
    AbortModel,
    AudioDelta,
    AudioDone,
    CancelSynthesis,
    Error,
    FunctionCallFailed,
    FunctionCallPublished,
    FunctionOutputApplied,
    InputCleared,
    ListenDecision,
    Output,
    PositionMetrics,
    Prefill,
    ResponseCreated,
    ResponseDone,
    SessionClosed,
    SessionConfigured,
    SpeechStarted,
    SpeechStopped,
    StartSynthesis,
    TextDelta,
    TextDone,
    TranscriptCompleted,
    TranscriptDelta,
    TurnCommitted,
    TurnStarted,
    TypedAccepted,
    TypedInjectionFinished,
    TypedInjectionStarted,
    TypedRejected,
)
from .functions import (
    FUNCTION_CALL_TIMEOUT_S,
    FUNCTION_OUTPUT_RECOVERY_MAX_FRAMES,
    MAX_FUNCTION_CALLS_PER_RESPONSE,
    Cycle,
    DeferredInput,
    OutputRejected,
    Tokenizer,
    advertised_name,
    arguments_json,
    call_id_for,
    result_tokens,
)
from .gate import InputGate, MicFrame
from .watchdog import AgentWatchdog
from .settlement import DEFAULT_FENCE, Settlement, bos_contract_failure
from .turns import TurnLedger
from .typed import TypedJob, rejection_reason

CANCEL_TAIL_MAX_POSITIONS = 27  # max_tail_frames (25) + 2
MAX_QUEUED_TYPED_REQUESTS = 8


@dataclass(frozen=True, slots=True)
class SessionConfig:
    session_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    settlement_blank_frames: int = DEFAULT_FENCE
    max_session_model_frames: int = DEFAULT_MAX_SESSION_MODEL_FRAMES
    cancel_tail_max_positions: int = CANCEL_TAIL_MAX_POSITIONS
    gate_threshold_dbfs: float = -40.0
    gate_open_after: int = 3
    preroll_frames: int = 12
    onset_context_frames: int = 2
    typed_input_ready: bool = True
    frame_seconds: float = 0.08
    tokenizer: Tokenizer = split_tokens
    """Tool-result text -> model tokens (the model home's tokenizer; the simulator's by default)."""
    function_call_timeout_s: float = FUNCTION_CALL_TIMEOUT_S
    max_function_calls_per_response: int = MAX_FUNCTION_CALLS_PER_RESPONSE
    function_recovery_max_frames: int = FUNCTION_OUTPUT_RECOVERY_MAX_FRAMES
    turn_policy: str = "client"
    """``client``: turns open and commit on client barriers (v3). ``model``: speech opens a turn and the model
    ends it (RNNT blank fence -> EOU); a client ``CommitInput`` forces the end (the tiered dialect)."""
    model_eou_blank_frames: int | None = None
    """The model-owned EOU fence in blank positions (default: ``settlement_blank_frames``)."""
    max_queued_input_frames: int = 1500
    """Input frames waiting for the model clock (120 s; ~3.8 MB). An append beyond it is refused whole with the
    recoverable ``input_backpressure``: a client sending faster than real time cannot grow the session's memory."""


@dataclass(frozen=True, slots=True)
class Tick:
    """What ``poll`` decided: outputs to dispatch, a position to run now, or when to poll again."""

    outputs: list[Output]
    position: Position | None = None
    wake_at: float | None = None


@dataclass(slots=True)
class _Plan:
    kind: PositionKind
    pcm: bytes = SILENT_INPUT_FRAME
    controls: PositionControls = NO_CONTROLS
    transport_frame: int | None = None


@dataclass(slots=True)
class _InputTurn:
    turn_id: str
    source: str
    job_id: str | None
    transcript: str = ""
    settling: bool = False
    """A procedure is ending this turn (settlement/EOU): a clear can no longer drop it."""
    quiet: int = 0
    """Consecutive quiet microphone frames (model-owned policy: ends a turn that never produced words)."""


@dataclass(slots=True)
class _Response:
    turn_id: str
    response_id: str
    text: str = ""
    audio_sent: bool = False


@dataclass(frozen=True, slots=True)
class _Item:
    kind: str  # frame | padding | start | commit | reack | typed | stop
    payload: Any = None


Procedure = Generator[_Plan, StepResult, None]


class SessionCore:
    def __init__(self, config: SessionConfig | None = None) -> None:
        self.config = config = config or SessionConfig()
        self.session_id = config.session_id
        self.runner = Stage0Runner(
            max_positions=config.max_session_model_frames, frame_seconds=config.frame_seconds
        )
        self.gate = InputGate(
            threshold_dbfs=config.gate_threshold_dbfs,
            open_after=config.gate_open_after,
            preroll_frames=config.preroll_frames,
            onset_context=config.onset_context_frames,
        )
        self.turns = TurnLedger()
        self._assembler = FrameAssembler(INPUT_FRAME_BYTES)
        self._transport_frames = 0
        self._queue: deque[_Item] = deque()
        self._proc: Procedure | None = None
        self._plan: _Plan | None = None
        self._out: list[Output] = []
        self.closed = False
        self._stopping = False
        # configuration
        self.prompt: SessionPrompt | None = None
        # The head is being prefilled; later updates wait so each ack follows the prefill of what it acks.
        self._configs: deque[Configure] = deque()
        self._settings_locked = False
        self._model_started = False
        # turns and responses
        self._turn_seq = 0
        self._response_seq = 0
        self._input_turn: _InputTurn | None = None
        self._pending_transcript = ""
        self.response: _Response | None = None
        self.blank_count = 0
        # typed input
        self._used_job_ids: set[str] = set()
        self._typed: TypedJob | None = None
        self._typed_waiting: deque[RequestTypedInput] = deque()
        # function calls
        self.cycle: Cycle | None = None
        self._deferred = DeferredInput()
        self._calls_published = 0
        self._scope_turn_id: str | None = None
        self._scope_calls = 0
        self._eou_turn_id: str | None = None
        self._pending_bos_turn: str | None = None
        self._inject_next: tuple[str, ...] = ()
        self._cancelling = False
        self._model_busy = False
        self._now = 0.0
        self._watchdog = AgentWatchdog()
        self._eos_next = False
        self._eos_reason: str | None = None
        # model-owned turn policy
        self.model_turns = config.turn_policy == "model"
        self.auto_eou = True
        """Model-owned EOU on the blank fence; off, only a ``CommitInput`` ends a turn."""
        self.eou_blank_frames = config.model_eou_blank_frames or config.settlement_blank_frames
        self._last_turn_outcome: str | None = None  # eou | committed | listen | cleared | held
        self._held_eou: _InputTurn | None = None  # a committed turn whose EOU waits for RespondNow

    # ================================================================ public API

    @property
    def configured(self) -> bool:
        return self.prompt is not None

    @property
    def settings_locked(self) -> bool:
        return self._settings_locked or self.runner.positions_run > 0

    @property
    def idle(self) -> bool:
        """Nothing queued, in flight or open, and no function-channel work (a call staged on the EOU position
        surfaces only on the positions after it): the model is merely listening."""
        return (
            not self._queue
            and self._proc is None
            and self.runner.in_flight is None
            and self.response is None
            and self._typed is None
            and not self._model_busy
        )

    def receive(self, command: Command, now: float) -> list[Output]:
        if self.closed:
            return []
        self._now = now
        if self._stopping:
            # session.stop is permanent: nothing after it is admitted; typed requests still get their answer.
            if isinstance(command, RequestTypedInput):
                self._emit(TypedRejected(command.job_id, "typed_input_unavailable"))
            return self._drain()
        if self.cycle is not None and isinstance(command, (AppendAudio, StartTurn, CommitTurn, CommitInput, ClearInput)):
            self._defer(command)
            return self._drain()
        self._dispatch(command)
        return self._drain()

    def _dispatch(self, command: Command) -> None:
        match command:
            case AppendAudio():
                self._on_append(command)
            case StartTurn():
                self._on_start(command)
            case CommitTurn():
                self._on_commit(command)
            case RequestTypedInput():
                self._on_typed_request(command)
            case Configure():
                self._on_configure(command)
            case Stop():
                self._on_stop(command)
            case SubmitFunctionOutput():
                self._on_function_output(command)
            case CommitInput():
                self._on_commit_input(command)
            case ClearInput():
                self._on_clear_input(command)
            case CancelResponse():
                self._on_cancel_response(command)
            case RespondNow():
                self._queue.append(_Item("respond", command))
            case _:
                raise TypeError(f"unknown command {command!r}")

    def poll(self, now: float) -> Tick:
        """Advance the session: start the next due position, if any."""
        self._now = now
        cycle = self.cycle
        if cycle is not None and cycle.state == "awaiting" and now >= cycle.deadline and not self.closed:
            self._function_timeout(cycle)
        while not self.closed and self.runner.in_flight is None and not self._configs:
            if self._plan is None:
                self._advance()
            # An idle plan (response silence) is recomputed on every poll, so new client work preempts it.
            plan = self._plan or self._idle_plan()
            if plan is None:
                if self.cycle is not None and self.cycle.state == "awaiting":
                    return Tick(self._drain(), wake_at=self.cycle.deadline)
                break
            if self._inject_next or self._eos_next:
                controls = plan.controls
                if self._inject_next:
                    controls = dataclasses.replace(controls, tool_result_tokens=self._inject_next)
                if self._eos_next:
                    controls = dataclasses.replace(controls, agent_eos=True)
                plan = dataclasses.replace(plan, controls=controls)
                if self._plan is not None:
                    self._plan = plan
            due = self.runner.due_at(plan.kind, now)
            if due > now:
                if self.cycle is not None and self.cycle.state == "awaiting":
                    due = min(due, self.cycle.deadline)  # the tool wait fires on time, not at the next frame
                return Tick(self._drain(), wake_at=due)
            try:
                position = self.runner.begin(plan.kind, plan.pcm, plan.controls, plan.transport_frame, now, due)
            except PositionLimitReached as limit:
                self._fatal_position_limit(limit)
                break
            self._inject_next = ()
            self._eos_next = False
            self._plan = plan
            self._model_started = True
            return Tick(self._drain(), position=position)
        return Tick(self._drain())

    def complete(self, position: Position, result: StepResult, now: float) -> list[Output]:
        """Deliver a finished position's result."""
        metrics = self.runner.finish(position, result, now)
        self._now = now
        plan, self._plan = self._plan, None
        if self.closed:
            return self._drain()
        self._metrics = metrics
        proc = self._proc
        if proc is not None:
            try:
                self._plan = proc.send(result)
            except StopIteration:
                if self._proc is proc:
                    self._proc = None
            if self.closed:
                self._plan = None
        else:
            assert plan is not None and plan.kind is PositionKind.RESPONSE_SILENCE
            self._publish(result)
        return self._drain()

    def fail(self, position: Position, error: BaseException, now: float) -> list[Output]:
        """The model raised on ``position``: the session is over."""
        self.runner.finish(position, None, now)
        self._plan = None
        if not self.closed:
            typed = self._typed
            if typed is not None and typed.mutated:
                self._fatal("typed_input_failed", f"typed input injection failed: {error}", details={"job_id": typed.job_id})
            else:
                self._fatal("internal_error", f"model failure: {error}", closed=("failed", "internal_error"))
        return self._drain()

    def prefilled(self, now: float) -> list[Output]:
        if not self._configs or self.closed:
            return self._drain()
        cfg = self._configs.popleft()
        self.prompt = cfg.prompt
        self._emit(SessionConfigured(cfg.prompt, cfg.client_event_id, restarted=True))
        while self._configs:
            nxt = self._configs[0]
            if nxt.prompt != self.prompt:
                self._emit(Prefill(nxt.prompt))
                break
            self._configs.popleft()
            self._emit(SessionConfigured(nxt.prompt, nxt.client_event_id, restarted=False))
        return self._drain()

    def prefill_failed(self, error: BaseException, now: float) -> list[Output]:
        if not self.closed:
            self._fatal("internal_error", f"model prefill failed: {error}", closed=("failed", "internal_error"))
        self._configs.clear()
        return self._drain()

    def synthesis_done(self, job_id: str, pcm16: bytes, now: float) -> list[Output]:
        job = self._typed
        if self.closed or job is None or job.job_id != job_id or job.state != "synthesizing":
            return []
        if not pcm16 or len(pcm16) % 2:
            return self.synthesis_failed(job_id, ValueError("synthesizer returned no whole PCM16 samples"), now)
        job.pcm = pcm16
        job.state = "ready"
        return self._drain()

    def synthesis_failed(self, job_id: str, error: BaseException, now: float) -> list[Output]:
        job = self._typed
        if self.closed or job is None or job.job_id != job_id or job.mutated:
            return []
        self._queue = deque(i for i in self._queue if i.payload is not job)
        self._emit(Error("typed_input_failed", f"typed input synthesis failed: {error}", False, job_id))
        self._finish_typed(job, "error")
        return self._drain()

    def abort_session(
        self,
        code: str,
        message: str,
        now: float,
        *,
        client_event_id: str | None = None,
        details: dict | None = None,
        closed: tuple[str, str] | None = None,
    ) -> list[Output]:
        """A wire-level protocol violation ends the session: same teardown as any fatal path."""
        self._fatal(code, message, client_event_id=client_event_id, details=details, closed=closed)
        return self._drain()

    @property
    def microphone_turn_open(self) -> bool:
        return self._input_turn is not None and self._input_turn.source == "microphone"

    @property
    def eou_held(self) -> bool:
        return self._held_eou is not None

    @property
    def last_turn_outcome(self) -> str | None:
        """How the last model-owned turn ended: ``eou`` (the model's own), ``committed`` (a client commit forced
        the EOU), ``listen``, ``cleared`` or ``held`` (None before any)."""
        return self._last_turn_outcome

    @property
    def input_active(self) -> bool:
        """A client turn is open or a typed job is active (settings are locked while either holds)."""
        return self._turn_or_job_active()

    def disconnect(self, now: float) -> list[Output]:
        """The transport went away: tear down silently (the outputs hold only effects)."""
        if self.closed:
            return []
        self.closed = True
        out: list[Output] = []
        if self._typed is not None and not self._typed.mutated:
            out.append(CancelSynthesis(self._typed.job_id))
        if self._model_started or self._configs or self.configured:
            out.append(AbortModel())
        self._reset_work()
        self._out.clear()
        return out

    # ================================================================ receipt of client commands

    def _on_configure(self, cmd: Configure) -> None:
        if self.settings_locked or self._turn_or_job_active():
            self._emit(Error("settings_locked", "session settings are locked after the first model input", False, cmd.client_event_id))
            return
        if self._configs:
            self._configs.append(cmd)  # evaluated once the prefill in progress completes
            return
        if self.prompt is not None and cmd.prompt == self.prompt:
            self._emit(SessionConfigured(cmd.prompt, cmd.client_event_id, restarted=False))
            return
        self._configs.append(cmd)
        self._emit(Prefill(cmd.prompt))

    def _turn_or_job_active(self) -> bool:
        return self.turns.turn_open or self._typed is not None

    def _on_append(self, cmd: AppendAudio) -> None:
        if not self.configured:
            self._emit(Error("session_not_configured", "send session.update before audio", False, cmd.client_event_id))
            return
        if self._typed is not None:
            return  # server-side half duplex while a typed job runs
        if self._input_backlogged(len(cmd.pcm)):
            limit = self.config.max_queued_input_frames
            self._emit(Error("input_backpressure", f"more than {limit} input frames are waiting for the model; "
                             "audio refused (send in real time)", False, cmd.client_event_id,
                             {"max_queued_input_frames": limit}))
            return
        for pcm in self._assembler.push(cmd.pcm):
            frame = self.gate.classify(pcm, self._transport_frames)
            self._transport_frames += 1
            released = self.gate.offer(frame)
            if released is None:
                self._emit_idle_metrics(frame)
            else:
                self._queue.extend(_Item("frame", f) for f in released)

    def _input_backlogged(self, incoming: int) -> bool:
        limit = self.config.max_queued_input_frames
        if len(self._queue) + incoming // INPUT_FRAME_BYTES <= limit:
            return False  # the cheap bound: the queue holds at least its frames
        queued = sum(1 for item in self._queue if item.kind in ("frame", "padding"))
        return queued + incoming // INPUT_FRAME_BYTES > limit

    def _on_start(self, cmd: StartTurn) -> None:
        verdict = self.turns.check_start(cmd.client_turn_id, typed_active=self._typed is not None)
        if verdict.action == "reack":
            self._queue.append(_Item("reack", TurnStarted(verdict.turn_id, cmd.client_turn_id, cmd.client_event_id)))
            return
        if verdict.action == "conflict":
            self._fatal("input_turn_conflict", verdict.message, client_event_id=cmd.client_event_id, details=verdict.details)
            return
        if not self.configured:
            self._emit(Error("session_not_configured", "send session.update before turn_start", False, cmd.client_event_id))
            return
        turn_id = self._new_turn_id()
        self.turns.start(cmd.client_turn_id, turn_id)
        self._settings_locked = True
        self._queue.append(_Item("start", (cmd, turn_id)))
        self._queue.extend(_Item("frame", f) for f in self.gate.force_open())

    def _on_commit(self, cmd: CommitTurn) -> None:
        verdict = self.turns.check_commit(cmd.client_turn_id)
        if verdict.action == "reack":
            self._queue.append(_Item("reack", TurnCommitted(verdict.turn_id, cmd.client_turn_id, cmd.client_event_id)))
            return
        if verdict.action == "conflict":
            self._fatal("input_turn_conflict", verdict.message, client_event_id=cmd.client_event_id, details=verdict.details)
            return
        turn_id = self.turns.commit(cmd.client_turn_id)
        tail = self._assembler.pad()
        if tail is not None:
            self._queue.append(_Item("padding", (tail, self._transport_frames)))
            self._transport_frames += 1
        self._queue.append(_Item("commit", (cmd, turn_id)))

    def _on_commit_input(self, cmd: CommitInput) -> None:
        if not self.configured:
            self._emit(Error("session_not_configured", "send session.update before committing", False, cmd.client_event_id))
            return
        if not self.gate.is_open and self.gate.heard_loud:
            # A short utterance that never held the gate open for long enough still counts.
            self._queue.extend(_Item("frame", f) for f in self.gate.force_open())
        tail = self._assembler.pad()
        if tail is not None and self.gate.is_open:
            self._queue.append(_Item("padding", (tail, self._transport_frames)))
            self._transport_frames += 1
        self._queue.append(_Item("commit_input", cmd))

    def _on_clear_input(self, cmd: ClearInput) -> None:
        self._assembler.discard()
        self.gate.clear()
        self._queue = deque(i for i in self._queue if i.kind not in ("frame", "padding"))
        self._pending_transcript = ""
        turn = self._input_turn
        if turn is not None and turn.source == "microphone" and not turn.settling:
            self._input_turn = None
            self._last_turn_outcome = "cleared"
            self._emit(SpeechStopped(turn.turn_id, "microphone", None))
            self._emit(InputCleared(turn.turn_id))

    def _on_cancel_response(self, cmd: CancelResponse) -> None:
        # Ahead of queued input: the cancel runs right after the position in flight.
        self._queue.appendleft(_Item("cancel", cmd))

    def _on_typed_request(self, cmd: RequestTypedInput) -> None:
        reason = rejection_reason(
            cmd.job_id,
            cmd.text,
            configured=self.configured,
            synthesizer_ready=self.config.typed_input_ready,
            mic_turn_open=self.turns.turn_open,
            function_cycle_open=self.cycle is not None,
            used_job_ids=self._used_job_ids | {r.job_id for r in self._typed_waiting},  # type: ignore[misc]
        )
        if reason is not None:
            self._emit(TypedRejected(cmd.job_id, reason))
            return
        job = self._typed
        if job is not None and not self._typed_started(job):
            # Replacement: cancel -> close -> start, before the old job touched the model.
            self._queue = deque(i for i in self._queue if i.payload is not job)
            if job.state == "synthesizing":
                self._emit(CancelSynthesis(job.job_id))
            self._finish_typed(job, "replaced")
        elif job is not None:
            if len(self._typed_waiting) >= MAX_QUEUED_TYPED_REQUESTS:
                self._emit(TypedRejected(cmd.job_id, "typed_input_unavailable"))
                return
            self._typed_waiting.append(cmd)
            return
        self._accept_typed(cmd)

    def _accept_typed(self, cmd: RequestTypedInput) -> None:
        assert isinstance(cmd.job_id, str) and isinstance(cmd.text, str)
        job = TypedJob(cmd.job_id, cmd.text)
        self._used_job_ids.add(job.job_id)
        self._typed = job
        self._settings_locked = True
        self._assembler.discard()
        self.gate.clear()
        self._emit(TypedAccepted(job.job_id))
        self._emit(StartSynthesis(job.job_id, job.text))
        self._queue.append(_Item("typed", job))

    def _typed_started(self, job: TypedJob) -> bool:
        return job.mutated or job.turn_id is not None

    def _on_stop(self, cmd: Stop) -> None:
        self._stopping = True
        self._release_typed(procedure_ends=False)
        self._queue.append(_Item("stop", cmd))

    def _release_typed(self, *, procedure_ends: bool) -> None:
        """Answer waiting typed requests and cancel an accepted job that has not touched the model.

        A job whose procedure already runs (its cancel tail) is left to it, unless that procedure ends too.
        """
        while self._typed_waiting:
            self._emit(TypedRejected(self._typed_waiting.popleft().job_id, "typed_input_unavailable"))
        job = self._typed
        if job is not None and not job.mutated and (procedure_ends or not self._typed_started(job)):
            self._queue = deque(i for i in self._queue if i.payload is not job)
            if job.state == "synthesizing":
                self._emit(CancelSynthesis(job.job_id))
            self._finish_typed(job, "cancelled")

    # ================================================================ scheduling

    def _advance(self) -> bool:
        """Make ``self._plan`` the next plan of the current or next procedure; False when nothing is runnable."""
        while not self.closed:
            if self._proc is None:
                self._proc = self._next_procedure()
                if self._proc is None:
                    return False
            try:
                self._plan = next(self._proc)
                return True
            except StopIteration:
                self._proc = None
        return False

    def _next_procedure(self) -> Procedure | None:
        while self._queue:
            item = self._queue[0]
            if item.kind == "typed" and item.payload.state == "synthesizing":
                return None  # blocked until synthesis is ready; an open response keeps moving meanwhile
            self._queue.popleft()
            match item.kind:
                case "frame":
                    f = item.payload
                    return self._frame_proc(PositionKind.REAL, f.pcm, f.transport_frame, f.loud)
                case "padding":
                    return self._frame_proc(PositionKind.COMMIT_PADDING, *item.payload)
                case "commit_input":
                    return self._commit_input_proc(item.payload)
                case "cancel":
                    return self._cancel_proc(item.payload)
                case "respond":
                    return self._respond_proc()
                case "reack":
                    self._emit(item.payload)
                case "start":
                    return self._start_proc(*item.payload)
                case "commit":
                    return self._commit_proc(*item.payload)
                case "typed":
                    return self._typed_proc(item.payload)
                case "stop":
                    return self._stop_proc()
                case "recovery":
                    return self._recovery_proc(item.payload)
        return None

    def _idle_plan(self) -> _Plan | None:
        # An open response, or function-channel work the model is in the middle of, keeps the clock moving.
        if self.response is not None or self._model_busy:
            return _Plan(PositionKind.RESPONSE_SILENCE)
        return None

    # ================================================================ procedures

    def _frame_proc(self, kind: PositionKind, pcm: bytes, transport_frame: int | None, loud: bool = False) -> Procedure:
        result = yield _Plan(kind, pcm, NO_CONTROLS, transport_frame)
        if not self.model_turns:
            self._publish(result)
            return
        turn = self._input_turn
        if turn is None and self._typed is None and (loud or result.rnnt.speech_confirmed):
            # Model-owned onset: speech opens a candidate turn (its RNNT words so far come with it).
            turn = self._open_input_turn(self._new_turn_id(), "microphone", None, "")
            if turn.transcript:
                self._emit(TranscriptDelta(turn.turn_id, turn.transcript, turn.transcript, "microphone", None))
        self._publish(result)
        if turn is None or turn is not self._input_turn or turn.settling or self.closed:
            return
        turn.quiet = 0 if loud or result.rnnt.speech_confirmed else turn.quiet + 1
        fence = self.eou_blank_frames
        if turn.transcript and self.auto_eou and self.blank_count >= fence - 1:
            yield from self._model_eou(turn, "new_response")
        elif not turn.transcript and turn.quiet >= fence and self.blank_count >= fence:
            self._listen(turn, "model_listen", None)

    def _model_eou(self, turn: _InputTurn, cancel_reason: str) -> Procedure:
        """End a model-owned turn: cancel a response it overlaps, then settle to the fence and fire the EOU."""
        turn.settling = True
        if self._must_cancel():
            yield from self._cancel_tail(cancel_reason)
            if self.closed:
                return
        yield from self._settle_and_eou(None)

    def _listen(self, turn: _InputTurn | None, reason: str, client_event_id: str | None) -> None:
        turn_id = None
        if turn is not None:
            turn_id = self._close_input_turn()
        self._last_turn_outcome = "listen"
        self._emit(ListenDecision(turn_id, reason, client_event_id))  # type: ignore[arg-type]

    def _commit_input_proc(self, cmd: CommitInput) -> Procedure:
        turn = self._input_turn
        if turn is None or turn.source != "microphone":
            if self._last_turn_outcome != "eou":
                self._listen(None, "silence_or_noise", cmd.client_event_id)
            return  # the model-owned EOU already took this audio: a redundant commit is benign
        if turn.settling:
            return
        turn.settling = True
        if self._must_cancel():
            yield from self._cancel_tail("new_response")
            if self.closed:
                return
        # Words still being decoded arrive during settlement; without any, the turn ends as a listen decision.
        steps = 0
        while not turn.transcript and self.blank_count < self.eou_blank_frames:
            result = yield _Plan(PositionKind.SETTLEMENT, SILENT_INPUT_FRAME, PositionControls(pre_eou=True))
            self._publish(result)
            if self.closed:
                return
            steps += 1
            if steps >= 2 * self.eou_blank_frames:
                break
        if not turn.transcript:
            self._listen(turn, "silence_or_noise", cmd.client_event_id)
            return
        if not cmd.respond:
            self._close_input_turn()
            self._held_eou = turn
            self._last_turn_outcome = "held"
            return
        yield from self._settle_and_eou(None)
        if self._last_turn_outcome == "eou":
            self._last_turn_outcome = "committed"  # a second commit of nothing is the client's mistake

    def _respond_proc(self) -> Procedure:
        turn, self._held_eou = self._held_eou, None
        if turn is None:
            return
        if self._must_cancel():
            yield from self._cancel_tail("new_response")
            if self.closed:
                return
        yield from self._eou_position(turn)

    def _cancel_proc(self, cmd: CancelResponse) -> Procedure:
        if self.cycle is None and self._must_cancel():  # a published call's wait is ended by its output
            yield from self._cancel_tail(cmd.reason)

    def _start_proc(self, cmd: StartTurn, turn_id: str) -> Procedure:
        if self._must_cancel():
            yield from self._cancel_tail("client_vad")
            if self.closed:
                return
        turn = self._open_input_turn(turn_id, "microphone", None, cmd.client_turn_id)
        self._emit(TurnStarted(turn_id, cmd.client_turn_id, cmd.client_event_id))
        if turn.transcript:
            self._emit(TranscriptDelta(turn_id, turn.transcript, turn.transcript, "microphone", None))

    def _commit_proc(self, cmd: CommitTurn, turn_id: str) -> Procedure:
        if self._must_cancel():
            # The model self-started during the user turn: drain it before settling (§6.6).
            yield from self._cancel_tail("pre_eou_activity_recovery:commit")
            if self.closed:
                return
        ack = TurnCommitted(turn_id, cmd.client_turn_id, cmd.client_event_id)
        yield from self._settle_and_eou(ack)

    def _typed_proc(self, job: TypedJob) -> Procedure:
        job.turn_id = self._new_turn_id()
        if self._must_cancel():
            yield from self._cancel_tail("typed_input")
            if self.closed:
                return
        frames = FrameAssembler(INPUT_FRAME_BYTES)
        pcm_frames = frames.push(job.pcm)
        tail = frames.pad()
        if tail is not None:
            pcm_frames.append(tail)
        for i, pcm in enumerate(pcm_frames):
            if i == 0:
                # The commit point: emitted immediately before the first model mutation.
                job.state = "mutated"
                self._emit(TypedInjectionStarted(job.job_id))
                self._open_input_turn(job.turn_id, "typed", job.job_id, job.job_id)
            result = yield _Plan(PositionKind.TYPED, pcm)
            self._publish(result)
        yield from self._settle_and_eou(None)
        if self.closed:
            return
        self._finish_typed(job, "completed")

    def _stop_proc(self) -> Procedure:
        tail = self._assembler.pad()
        if tail is not None and self._model_started:
            result = yield _Plan(PositionKind.FINAL, tail)
            self._publish(result)
            if self.closed:
                return
        elif not self._model_started and self.configured:
            self._emit(AbortModel())
        self._close_brackets("completed", "client_stop")
        self._emit(SessionClosed("completed", "client_stop"))
        self.closed = True
        self._reset_work()

    def _must_cancel(self) -> bool:
        """An open response, or function-channel work not yet shown to the client, must end before new input."""
        return self.response is not None or self._model_busy

    def _cancel_tail(self, reason: str) -> Procedure:
        """Drive the model to quiet with output suppressed (agent EOS, then silent positions); close the open
        response as cancelled.

        The acoustic tail is bounded at ``cancel_tail_max_positions``; positions spent while the function channel
        drains a call that was never published (its result is the ``cancelled_by_new_client_turn`` error) count
        against the post-function recovery bound instead.
        """
        response = self.response
        controls = PositionControls(agent_eos=True)
        tail = drain = 0
        self._cancelling = True
        try:
            while True:
                result = yield _Plan(PositionKind.CANCEL_TAIL, SILENT_INPUT_FRAME, controls)
                controls = NO_CONTROLS
                self._publish(result, suppress=True)
                if self.closed:
                    return
                fn = result.function
                busy = fn.busy or fn.post_fc_bos_pending
                terminal = result.boundary.ended or result.boundary.phase.value in ("idle", "complete")
                if not busy and terminal:
                    if self.response is not None:
                        self._close_response("cancelled", reason)
                    self._pending_bos_turn = None  # an unpublished deferred-BOS cycle was interrupted
                    return
                if busy:
                    drain += 1
                else:
                    tail += 1
                if tail >= self.config.cancel_tail_max_positions or drain >= self.config.function_recovery_max_frames:
                    break
        finally:
            self._cancelling = False
        self._fatal(
            "response_cancel_timeout",
            f"the model did not reach its acoustic terminal within {self.config.cancel_tail_max_positions} positions",
            details={"response_id": response.response_id, "turn_id": response.turn_id} if response else {},
        )

    def _settle_and_eou(self, ack: TurnCommitted | None) -> Procedure:
        """Settle to the RNNT fence, then the explicit EOU: fused into the fence position without tools."""
        turn = self._input_turn
        assert turn is not None
        fused = not (self.prompt and self.prompt.tools)
        settlement = Settlement(fence=self.config.settlement_blank_frames, fused=fused, blank_count=self.blank_count)
        while not (not fused and settlement.fence_met):
            controls = dataclasses.replace(settlement.next_controls(), pre_eou=True)
            result = yield _Plan(PositionKind.SETTLEMENT, SILENT_INPUT_FRAME, controls)
            outcome = settlement.on_result(result, controls)
            if outcome.kind == "fatal":
                if outcome.publish:
                    self._publish(result)
                self._fatal(
                    outcome.code,
                    outcome.message,
                    details={"settlement": outcome.details, "source": turn.source, "job_id": turn.job_id},
                )
                return
            if outcome.kind == "fused_terminal":
                self._eou_turn_id = turn.turn_id
                self._last_turn_outcome = "eou"
                self._publish(result, ack=ack, close_turn=True)
                return
            self._publish(result)
            if outcome.kind == "fence_reached":
                break
        # Separate EOU (tools): commit after settlement, then one EOU position so the function guard covers it.
        if ack is not None:
            self._emit(ack)
        self._close_input_turn()
        yield from self._eou_position(turn)

    def _eou_position(self, turn: _InputTurn) -> Procedure:
        """One explicit EOU position: agent BOS, or a function cycle whose BOS is deferred."""
        result = yield _Plan(PositionKind.EOU, SILENT_INPUT_FRAME, PositionControls(eou_now=True))
        self._eou_turn_id = turn.turn_id
        self._last_turn_outcome = "eou"
        details = {"source": turn.source, "job_id": turn.job_id}
        if result.agent.control is not AgentControl.AGENT_BOS:
            if result.function.busy:
                # The EOU position opened a function cycle: BOS is expected after its result (deferred BOS).
                if self._pending_bos_turn is not None:
                    self._fatal("overlapping_bos_expectation", "a deferred BOS is already pending", details=details)
                    return
                self._pending_bos_turn = turn.turn_id
                self._publish(result, eou_turn_id=turn.turn_id)
                return
            self._fatal("missing_terminal_bos", "the EOU position produced neither agent BOS nor a function cycle",
                        details=details)
            return
        failure = bos_contract_failure(result)
        if failure is not None:
            self._fatal("separate_eou_contract_failure", failure, details=details)
            return
        self._publish(result, eou_turn_id=turn.turn_id)

    # ================================================================ function calls

    def _on_tool_call(self, result: StepResult, suppress: bool) -> None:
        """A call completed on the function channel: publish it as a transaction, or refuse it."""
        call = result.tool_call
        assert call is not None
        if suppress or self._cancelling:
            # The initiating turn is being cancelled by a new client turn: never shown to the client.
            self._inject_next = tuple(self.config.tokenizer(wrap_tool_result('{"error":"cancelled_by_new_client_turn"}')))
            return
        if self.cycle is not None:
            self._fatal("internal_error", "a second function cycle overlapped the open one",
                        closed=("failed", "internal_error"))
            return
        response = self.response
        turn_id = response.turn_id if response is not None else (self._eou_turn_id or self._new_turn_id())
        if turn_id != self._scope_turn_id:
            self._scope_turn_id, self._scope_calls = turn_id, 0  # a new user turn starts a fresh budget
        self._scope_calls += 1
        self._calls_published += 1
        call_id = call_id_for(self.session_id, self._calls_published)
        limit = self.config.max_function_calls_per_response
        if self._scope_calls > limit:
            self._fatal(
                "function_call_loop_limit",
                f"more than {limit} function calls in one user turn",
                details={"call_id": call_id, "attempt": self._scope_calls, "limit": limit},
                closed=("failed", "function_call_loop_limit"),
            )
            return
        if response is None:
            response = self._open_response(turn_id)
        tools = self.prompt.tools if self.prompt else ()
        name = advertised_name(call.name, tools)
        self.cycle = Cycle(
            call_id=call_id,
            name=name,
            turn_id=turn_id,
            response_id=response.response_id,
            deadline=self._now + self.config.function_call_timeout_s,
            deferred_bos=self._pending_bos_turn is not None,
        )
        self._pending_bos_turn = None
        self._emit(FunctionCallPublished(turn_id, response.response_id, call_id, name, arguments_json(call, tools)))

    def _on_function_output(self, cmd: SubmitFunctionOutput) -> None:
        try:
            tokens = result_tokens(
                self.cycle, cmd.call_id, cmd.output, cmd.model_output, cmd.model_output_negotiated, self.config.tokenizer
            )
        except OutputRejected as rejected:
            # Recoverable: the call stays pending, a corrected resubmission can still complete it.
            self._emit(Error("invalid_function_call_output", rejected.message, False, cmd.client_event_id,
                             {"call_id": rejected.call_id}))
            return
        cycle = self.cycle
        assert cycle is not None
        self._start_recovery(cycle, tokens)

    def _function_timeout(self, cycle: Cycle) -> None:
        self._emit(FunctionCallFailed(cycle.turn_id, cycle.response_id, cycle.call_id, "function_call_output_timeout"))
        if cycle.deferred_bos:
            self._fatal(
                "function_call_output_timeout",
                f"no result for {cycle.call_id} within {self.config.function_call_timeout_s:g} s (deferred BOS pending)",
                details={"call_id": cycle.call_id},
            )
            return
        cycle.terminal = "failed"
        tokens = tuple(self.config.tokenizer(wrap_tool_result('{"error":"function_call_output_timeout"}')))
        self._start_recovery(cycle, tokens)
        # `failed` is the call's terminal for the client: turn state is restored now and held input replays
        # (queued behind the recovery positions that feed the model its error result).
        self._finish_cycle(cycle)

    def _start_recovery(self, cycle: Cycle, tokens: tuple[str, ...]) -> None:
        cycle.state = "recovering"
        self._inject_next = tokens
        self._queue.appendleft(_Item("recovery", cycle))

    def _recovery_proc(self, cycle: Cycle) -> Procedure:
        """Zero-input positions at >= 80 ms until the cycle is idle (and a deferred BOS arrived), then ack."""
        for _ in range(self.config.function_recovery_max_frames):
            result = yield _Plan(PositionKind.RECOVERY)
            self._publish(result)
            if self.closed:
                return
            fn = result.function
            if cycle.deferred_bos:
                if result.agent.control is AgentControl.AGENT_BOS:
                    cycle.deferred_bos = False
                elif not fn.busy and not fn.post_fc_bos_pending:
                    self._fatal("missing_post_fc_terminal_bos",
                                "the function cycle ended without the deferred agent BOS",
                                details={"call_id": cycle.call_id})
                    return
            if not fn.busy and not cycle.deferred_bos:
                self._finish_cycle(cycle)
                return
        self._fatal(
            "function_output_apply_timeout",
            f"post-function recovery not idle within {self.config.function_recovery_max_frames} positions",
            details={"call_id": cycle.call_id},
        )

    def _finish_cycle(self, cycle: Cycle) -> None:
        if self.cycle is not cycle:
            return  # already finished (a timed-out cycle ends at `failed`)
        self.cycle = None
        if cycle.terminal == "applied":
            self._emit(FunctionOutputApplied(cycle.call_id))
        for command in self._deferred.drain():  # held microphone input, in its original order
            if self.closed:
                return
            self._dispatch(command)

    def _defer(self, command: Command) -> None:
        size = getattr(command, "wire_bytes", 0) or (len(command.pcm) if isinstance(command, AppendAudio) else 64)
        if not self._deferred.offer(command, size):
            self._fatal(
                "deferred_input_overflow",
                f"more than {self._deferred.limit} bytes of input held during a function cycle",
                client_event_id=getattr(command, "client_event_id", None),
            )

    # ================================================================ publication

    def _publish(
        self,
        result: StepResult,
        *,
        ack: TurnCommitted | None = None,
        close_turn: bool = False,
        suppress: bool = False,
        eou_turn_id: str | None = None,
    ) -> None:
        """Publish one position's events in contract order; then its metrics."""
        self.blank_count = result.rnnt.blank_count
        self._model_busy = result.function.busy or result.function.post_fc_bos_pending
        if ack is not None:
            self._emit(ack)
        delta = result.rnnt.text_delta
        if delta:
            turn = self._input_turn
            if turn is None:
                self._pending_transcript += delta  # RNNT evidence never opens a turn
            else:
                turn.transcript += delta
                self._emit(TranscriptDelta(turn.turn_id, delta, turn.transcript, turn.source, turn.job_id))  # type: ignore[arg-type]
        if close_turn:
            eou_turn_id = self._close_input_turn()
        agent = result.agent
        if agent.control is AgentControl.AGENT_BOS and self.response is None and not suppress:
            self._open_response(eou_turn_id or self._new_turn_id())
        if result.tool_call is not None:
            self._on_tool_call(result, suppress)
            if self.closed:
                return
        response = self.response
        if response is not None and not suppress:
            if agent.delta:
                response.text += agent.delta
                self._emit(TextDelta(response.turn_id, response.response_id, agent.delta, response.text))
            if result.audio:
                response.audio_sent = True
                self._emit(AudioDelta(response.turn_id, response.response_id, result.audio))
            if result.boundary.ended:
                self._close_response("completed", self._eos_reason or result.boundary.reason or "model_or_turn_taking")
            elif self._model_busy or self.cycle is not None:
                self._watchdog.reset()  # function work is not a stall; speech after it is a new stretch
            elif result.boundary.phase is BoundaryPhase.RESPONDING and not result.boundary.started:
                reason = self._watchdog.observe(result)
                if reason is not None:
                    self._eos_next = True
                    self._eos_reason = reason
        self._emit_metrics(result, delivered=response is not None and not suppress)

    def _emit_metrics(self, result: StepResult, delivered: bool) -> None:
        m: StepMetrics = self._metrics
        response = self.response
        self._emit(
            PositionMetrics(
                frame=m.frame,
                transport_frame=m.transport_frame,
                kind=m.kind.value,
                inference_ms=round(m.inference_ms, 3),
                server_step_ms=round(m.server_step_ms, 3),
                budget_ms=m.budget_ms,
                over_budget=m.over_budget,
                input_audio=not m.kind.synthetic,
                output_audio=bool(result.audio),
                audio_delivered=delivered and bool(result.audio),
                turn_id=self._input_turn.turn_id if self._input_turn else (response.turn_id if response else None),
                response_id=response.response_id if response else None,
                turn_state={
                    "open_client_turn_id": self.turns.open_client_turn_id,
                    "blank_count": result.rnnt.blank_count,
                    "agent_control": result.agent.control.value,
                    "boundary": result.boundary.phase.value,
                    "late_ms": round(m.late_ms, 3),
                    "function_cycle": self.cycle.call_id if self.cycle else None,
                    "model": result.telemetry,
                },
            )
        )

    def _emit_idle_metrics(self, frame: MicFrame) -> None:
        self._emit(
            PositionMetrics(
                frame=None,
                transport_frame=frame.transport_frame,
                kind="gated",
                inference_ms=0.0,
                server_step_ms=0.0,
                budget_ms=80.0,
                over_budget=False,
                input_audio=True,
                output_audio=False,
                audio_delivered=False,
                turn_id=None,
                response_id=None,
                turn_state={"gate": "closed", "preroll_frames": self.gate.held},
            )
        )

    # ================================================================ turn, response and job bookkeeping

    def _new_turn_id(self) -> str:
        self._turn_seq += 1
        return f"turn_{self.session_id}_{self._turn_seq}"

    def _open_input_turn(self, turn_id: str, source: str, job_id: str | None, correlation: int | str) -> _InputTurn:
        turn = _InputTurn(turn_id, source, job_id, self._pending_transcript)
        self._pending_transcript = ""
        self._input_turn = turn
        self._emit(SpeechStarted(turn_id, source, job_id, correlation))  # type: ignore[arg-type]
        return turn

    def _close_input_turn(self) -> str | None:
        turn, self._input_turn = self._input_turn, None
        if turn is None:
            return None
        self._emit(SpeechStopped(turn.turn_id, turn.source, turn.job_id))  # type: ignore[arg-type]
        self._emit(TranscriptCompleted(turn.turn_id, turn.transcript, turn.source, turn.job_id))  # type: ignore[arg-type]
        return turn.turn_id

    def _open_response(self, turn_id: str) -> _Response:
        self._watchdog.reset()
        self._eos_reason = None
        self._response_seq += 1
        self.response = _Response(turn_id, f"response_{self.session_id}_{self._response_seq}")
        self._emit(ResponseCreated(turn_id, self.response.response_id))
        return self.response

    def _close_response(self, status: str, reason: str) -> None:
        response, self.response = self.response, None
        if response is None:
            return
        self._emit(TextDone(response.turn_id, response.response_id, response.text))
        self._emit(AudioDone(response.turn_id, response.response_id, not response.audio_sent))
        self._emit(ResponseDone(response.turn_id, response.response_id, status, reason))  # type: ignore[arg-type]

    def _close_brackets(self, response_status: str, reason: str) -> None:
        self._close_input_turn()
        self._close_response(response_status, reason)

    def _finish_typed(self, job: TypedJob, disposition: str) -> None:
        job.state = "done"
        if self._typed is job:
            self._typed = None  # readiness barrier: cleared before injection_finished is sent
        self._emit(TypedInjectionFinished(job.job_id, disposition))  # type: ignore[arg-type]
        while self._typed is None and self._typed_waiting and not self._stopping:
            self._on_typed_request(self._typed_waiting.popleft())

    # ================================================================ fatal paths

    def _fatal(
        self,
        code: str,
        message: str,
        *,
        client_event_id: str | None = None,
        details: dict | None = None,
        closed: tuple[str, str] | None = None,
        brackets: str | None = None,
    ) -> None:
        """Abort the model, publish the fatal error (and brackets / session.closed where the contract says)."""
        if self.closed:
            return
        self._stopping = True
        if self._model_started or self._configs or self.configured:
            self._emit(AbortModel())
        # Every typed request gets its answer and every response exactly one terminal before the error (a v3
        # client disconnects on the fatal error itself); the position guard closes its brackets after it.
        self._release_typed(procedure_ends=True)
        if brackets is None:
            self._close_response("failed", code)
        self._emit(Error(code, message, True, client_event_id, details or {}))
        if brackets is not None:
            self._close_brackets("failed", brackets)
        if closed is not None:
            self._emit(SessionClosed(closed[0], closed[1]))  # type: ignore[arg-type]
        self.closed = True
        self._reset_work()

    def _fatal_position_limit(self, limit: PositionLimitReached) -> None:
        self._fatal(
            "session_position_limit",
            f"session reached {limit.limit} model positions",
            details={"model_frames": limit.positions, "max_model_frames": limit.limit},
            brackets="session_position_limit",
            closed=("failed", "session_position_limit"),
        )

    def _reset_work(self) -> None:
        self._queue.clear()
        self._configs.clear()
        self._deferred.drain()
        proc, self._proc = self._proc, None
        if proc is not None and inspect.getgeneratorstate(proc) != inspect.GEN_RUNNING:
            proc.close()
        self._plan = None
        self._typed_waiting.clear()

    # ================================================================ outputs

    def _emit(self, output: Output) -> None:
        self._out.append(output)

    def _drain(self) -> list[Output]:
        out, self._out = self._out, []
        return out

