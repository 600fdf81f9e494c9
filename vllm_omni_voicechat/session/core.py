"""The voicechat session core: a sans-I/O state machine over the Stage 0 runner.

Inputs: client commands (``receive``), model step results (``complete`` / ``fail``), shell completions
(``prefilled``, ``synthesis_done`` ...) and clock ticks (``poll``), each with an injected ``now``. Outputs: an
ordered list of native events and effects. The shell loop is::

    tick = core.poll(now)            # outputs, maybe a position to run, maybe a wake-up time
    result = model.step(tick.position.input)           # off the event loop
    outputs = core.complete(tick.position, result, now)

Client barriers are ordered with the audio around them in one work queue (``work.py``); the microphone's commands
are checked at receipt by ``input_turns.py``, and each item runs as a procedure (``procedures.py``). What the
client sees of a position is the conversation's (``conversation.py``); typed jobs and function cycles are their own
modules. The session's lifecycle is one phase (``phase.py``), the input turn's one state (``lifecycle.py``), each
with its legal moves in one table.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections import deque
from dataclasses import dataclass, field

from ..errors import StateError
from ..ids import SYSTEM_IDS
from ..model.port import SessionPrompt, StepResult
from ..model.tokens import split_tokens
from ..records import record
from ..runner.stage0 import (
    DEFAULT_MAX_SESSION_MODEL_FRAMES,
    Position,
    PositionKind,
    PositionLimitReached,
    Stage0Runner,
)
from .commands import (
    AppendAudio,
    CancelResponse,
    ClearInput,
    Command,
    CommitInput,
    CommitTurn,
    Configure,
    RequestTypedInput,
    RespondFirst,
    RespondNow,
    StartTurn,
    Stop,
    SubmitFunctionOutput,
)
from .conversation import Conversation, Response
from .events import (
    AbortModel,
    CancelSynthesis,
    Error,
    Output,
    Prefill,
    SessionClosed,
    SessionConfigured,
    TypedRejected,
)
from .functions import (
    CALL_ID_HEX,
    FUNCTION_CALL_TIMEOUT_S,
    FUNCTION_OUTPUT_RECOVERY_MAX_FRAMES,
    MAX_FUNCTION_CALLS_PER_RESPONSE,
    Cycle,
    FunctionCycles,
    Tokenizer,
)
from .failure import SessionFailure
from .gate import MicFrame
from .lifecycle import TurnState
from . import input_turns, procedures
from .microphone import Microphone
from .phase import Move, Phase, next_phase
from .procedures import Plan, Procedure
from .settlement import DEFAULT_FENCE
from .turns import TurnLedger
from .typed import TypedJobs
from .work import (
    Cancel,
    Close,
    CommitClientTurn,
    EndInput,
    InjectTyped,
    OpenTurn,
    Reack,
    Recover,
    Respond,
    SpeakFirst,
    TailPadding,
    WorkQueue,
)

CANCEL_TAIL_MAX_POSITIONS = 27  # max_tail_frames (25) + 2


@dataclass(frozen=True, slots=True)
class SessionConfig:
    session_id: str = field(default_factory=SYSTEM_IDS.uuid)
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
    call_id_hex: int = CALL_ID_HEX
    """Hex digits of a published call id (``call_`` + this many): 27 where a wire caps ids at 32 characters (the
    OpenAI lane, as OpenAI does; LiveKit rewrites a longer one and the output then names no pending call)."""
    max_queued_input_frames: int = 1500
    """Input frames waiting for the model clock (120 s; ~3.8 MB). An append beyond it is refused whole with the
    recoverable ``input_backpressure``: a client sending faster than real time cannot grow the session's memory."""
    settlement_await_s: float = 0.0
    """A settlement position that finds no quiet frame queued waits up to this long for the client's next one when
    that is expected within it (a frame after the last), if the model home runs this session's audio together with
    other sessions' (``StepTimings.batched_with``): it would hold a zero position for them about as long, and the
    frame would then wait behind it. A session the model home runs alone never waits. 0: zeros at once."""


@record
class Tick:
    """What ``poll`` decided: outputs to dispatch, a position to run now, or when to poll again."""

    outputs: list[Output]
    position: Position | None = None
    wake_at: float | None = None


class SessionCore:
    """The driving interface is ``receive`` / ``poll`` / ``complete`` / ``fail``, the shell completions
    (``prefilled``, ``prefill_failed``, ``synthesis_done``, ``synthesis_failed``), ``abort_session`` and
    ``disconnect``; the properties are read-only views. ``emit``, ``work`` and the ``inject_next`` / ``eos_next``
    controls serve the session's own collaborators (procedures, typed jobs, function cycles, the conversation, input
    turns). A collaborator that finds the session cannot go on raises ``SessionFailure``; every entry point catches
    it and runs the one teardown (``_fatal``). Input a function cycle held comes back as a return value, for the core
    to dispatch again."""

    tally = None
    """A bare core keeps no tally (its wire session does)."""
    held_messages = 0
    """A bare core holds no client frames: its commands go straight to its work."""

    def __init__(self, config: SessionConfig | None = None) -> None:
        self.config = config = config or SessionConfig()
        self.session_id = config.session_id
        self.runner = Stage0Runner(max_positions=config.max_session_model_frames, frame_seconds=config.frame_seconds)
        self.turns = TurnLedger()
        self.work = WorkQueue()
        self.microphone = Microphone(config, self.work)
        self.phase = Phase.OPEN
        self.closed = False
        """``phase is Phase.CLOSED``, kept by :meth:`_move` (read on every step)."""
        self.now = 0.0
        self.prompt: SessionPrompt | None = None
        # The parts emit into this list (never replaced: they hold its append) and are handed the core per call,
        # never keeping it: an ended session is freed by reference counting, without the cycle collector.
        self._out: list[Output] = []
        emit = self._out.append
        # The head is being prefilled; later updates wait so each ack follows the prefill of what it acks.
        self._configs: deque[Configure] = deque()
        self.functions = FunctionCycles()
        self.typed = TypedJobs(emit, self.work, self.microphone)
        self.conversation = Conversation(emit, self.session_id, self.turns, self.functions)
        self._proc: Procedure | None = None
        self.barrier_running = False
        """The procedure running is a client turn barrier's (``turn_start`` / ``commit``, through the EOU)."""
        self._plan: Plan | None = None
        self.settlement_audio = False
        """A settlement runs that takes quiet microphone frames queued after its commit instead of zeros (set by the
        settlement's procedure; ended for it by speech or a non-audio item at the head of the work queue)."""
        self._audio_batched = False
        """The session's last audio position ran together with other sessions' (``settlement_await_s``)."""
        self._next_tokens: tuple[str, ...] = ()  # tool-result tokens for the next position
        self._next_eos = False  # agent EOS on the next position (a watchdog fired)
        # model-owned turn policy
        self.model_turns = config.turn_policy == "model"
        self.auto_eou = True
        """Model-owned EOU on the blank fence; off, only a ``CommitInput`` ends a turn."""
        self.eou_blank_frames = config.model_eou_blank_frames or config.settlement_blank_frames

    # ================================================================ state

    @property
    def stopping(self) -> bool:
        """Nothing new is admitted (``session.stop``, a fatal error, or closed)."""
        return self.phase is not Phase.OPEN

    @property
    def configured(self) -> bool:
        return self.prompt is not None

    @property
    def configuring(self) -> bool:
        """A ``session.update`` is being prefilled: its ack (the model-ready barrier) is not out yet."""
        return bool(self._configs)

    @property
    def model_started(self) -> bool:
        return self.runner.positions_run > 0

    @property
    def settings_locked(self) -> bool:
        """Fixed by the first model input: a client turn, a typed job or a model position."""
        return self.turns.started_any or bool(self.typed.used) or self.model_started

    @property
    def input_active(self) -> bool:
        """A client turn is open or a typed job is active (settings are locked while either holds)."""
        return self.turns.turn_open or self.typed.job is not None

    @property
    def response(self) -> Response | None:
        return self.conversation.response

    @property
    def cycle(self) -> Cycle | None:
        return self.functions.cycle

    @property
    def idle(self) -> bool:
        """Nothing queued, in flight or open, and no function-channel work (a call staged on the EOU position
        surfaces only on the positions after it): the model is merely listening."""
        return (
            not self.work
            and self._proc is None
            and self.runner.in_flight is None
            and self.conversation.response is None
            and self.typed.job is None
            and not self.conversation.model_busy
        )

    @property
    def turn_state(self) -> TurnState:
        """The input turn's lifecycle state (``lifecycle.py``)."""
        return self.conversation.lifecycle.state

    @property
    def microphone_turn_open(self) -> bool:
        turn = self.conversation.lifecycle.turn
        return turn is not None and turn.source == "microphone"

    @property
    def microphone_turn_settling(self) -> bool:
        """A microphone turn is being settled toward its EOU (or its held EOU)."""
        lifecycle = self.conversation.lifecycle
        return lifecycle.settling and lifecycle.turn is not None and lifecycle.turn.source == "microphone"

    @property
    def must_cancel(self) -> bool:
        """An open response, or function-channel work not yet shown to the client, must end before new input."""
        return self.conversation.response is not None or self.conversation.model_busy

    # ================================================================ driving interface

    def receive(self, command: Command, now: float, arrived: float | None = None) -> list[Output]:
        """``arrived``: when the host read the client message (``AppendAudio.arrived``; None: ``now``)."""
        if self.closed:
            return []
        self.now = now
        if arrived is not None and type(command) is AppendAudio and command.arrived is None:
            command = dataclasses.replace(command, arrived=arrived)
        if self.phase is Phase.STOPPING:
            # session.stop is permanent: nothing after it is admitted; typed requests still get their answer.
            if isinstance(command, RequestTypedInput):
                self.emit(TypedRejected(command.job_id, "typed_input_unavailable"))
            return self._drain()
        functions = self.functions
        try:
            if functions.cycle is not None and functions.holds(command):
                if type(command) is AppendAudio and command.arrived is not None:
                    command = dataclasses.replace(command, arrived=None)  # held by design: late from its replay
                functions.defer(self, command)
            else:
                self._dispatch(command)
        except SessionFailure as failure:
            self._failed(failure)
        return self._drain()

    def poll(self, now: float) -> Tick:
        """Advance the session: start the next due position, if any."""
        self.now = now
        try:
            return self._poll(now)
        except SessionFailure as failure:
            self._failed(failure)
            return Tick(self._drain())

    def _poll(self, now: float) -> Tick:
        functions = self.functions
        if functions.cycle is not None and not self.closed:
            self._dispatch_again(functions.check_deadline(self, now))
        while not self.closed and self.runner.in_flight is None and not self._configs:
            if self._plan is None:
                self._advance()
            # An idle plan (response silence) is recomputed on every poll, so new client work preempts it.
            plan = self._plan or self._idle_plan()
            if plan is None:
                if functions.awaiting:
                    return Tick(self._drain(), wake_at=functions.cycle.deadline)  # type: ignore[union-attr]
                break
            if self._next_tokens or self._next_eos:
                controls = plan.controls
                if self._next_tokens:
                    controls = dataclasses.replace(controls, tool_result_tokens=self._next_tokens)
                if self._next_eos:
                    controls = dataclasses.replace(controls, agent_eos=True)
                plan = dataclasses.replace(plan, controls=controls)
                if self._plan is not None:
                    self._plan = plan
            if plan.queued_audio:
                plan = self._settlement_input(plan)
                if self._plan is not None:
                    self._plan = plan
            due = self.runner.due_at(plan.kind, now, plan.ready)
            if due > now:
                if functions.awaiting:
                    due = min(due, functions.cycle.deadline)  # type: ignore[union-attr]  # the tool wait fires on time
                return Tick(self._drain(), wake_at=due)
            try:
                position = self.runner.begin(plan.kind, plan.pcm, plan.controls, plan.transport_frame, now, due,
                                             plan.arrived, plan.input_audio)
            except PositionLimitReached as limit:
                self._fatal_position_limit(limit)
                break
            self._next_tokens = ()
            self._next_eos = False
            self._plan = plan
            return Tick(self._drain(), position=position)
        return Tick(self._drain())

    def complete(self, position: Position, result: StepResult, now: float) -> list[Output]:
        """Deliver a finished position's result."""
        metrics = self.runner.finish(position, result, now)
        self.now = now
        plan, self._plan = self._plan, None
        if self.closed:
            return self._drain()
        self.conversation.step_metrics = metrics
        if position.input_audio:
            self._audio_batched = result.timings.batched_with > 1
        proc = self._proc
        if proc is None and (plan is None or plan.kind is not PositionKind.RESPONSE_SILENCE):
            raise StateError(f"a {position.kind.value} position completed without its procedure")
        try:
            if proc is None:
                self.conversation.publish(self, result)
            else:
                try:
                    self._plan = proc.send(result)
                except StopIteration as ended:
                    if self._proc is proc:
                        self._proc = None
                        self.barrier_running = False
                    self._dispatch_again(ended.value)
                if self.closed:
                    self._plan = None
        except SessionFailure as failure:
            self._failed(failure)
        return self._drain()

    def fail(self, position: Position, error: BaseException, now: float) -> list[Output]:
        """The model raised on ``position``: the session is over."""
        self.runner.finish(position, None, now)
        self._plan = None
        if not self.closed:
            job = self.typed.job
            if job is not None and job.mutated:
                self._fatal("typed_input_failed", f"typed input injection failed: {error}",
                           details={"job_id": job.job_id})
            else:
                self._fatal("internal_error", f"model failure: {error}", closed=("failed", "internal_error"))
        return self._drain()

    def prefilled(self, now: float) -> list[Output]:
        if not self._configs or self.closed:
            return self._drain()
        cfg = self._configs.popleft()
        self.prompt = cfg.prompt
        self.emit(SessionConfigured(cfg.prompt, cfg.client_event_id, restarted=True))
        while self._configs:
            nxt = self._configs[0]
            if nxt.prompt != self.prompt:
                self.emit(Prefill(nxt.prompt))
                break
            self._configs.popleft()
            self.emit(SessionConfigured(nxt.prompt, nxt.client_event_id, restarted=False))
        return self._drain()

    def prefill_failed(self, error: BaseException, now: float) -> list[Output]:
        if not self.closed:
            self._fatal("internal_error", f"model prefill failed: {error}", closed=("failed", "internal_error"))
        self._configs.clear()
        return self._drain()

    def synthesis_done(self, job_id: str, pcm16: bytes, now: float) -> list[Output]:
        if self.closed:
            return []
        if not self.typed.synthesized(job_id, pcm16):
            return self.synthesis_failed(job_id, ValueError("synthesizer returned no whole PCM16 samples"), now)
        return self._drain()

    def synthesis_failed(self, job_id: str, error: BaseException, now: float) -> list[Output]:
        if self.closed:
            return []
        try:
            self.typed.synthesis_failed(self, job_id, error)
        except SessionFailure as failure:
            self._failed(failure)
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

    def disconnect(self, now: float) -> list[Output]:
        """The transport went away: tear down silently (the outputs hold only effects)."""
        if self.closed:
            return []
        self._move(Move.CLOSE)
        out: list[Output] = []
        job = self.typed.job
        if job is not None and not job.mutated:
            out.append(CancelSynthesis(job.job_id))
        if self.model_started or self._configs or self.configured:
            out.append(AbortModel())
        self._reset_work()
        self._out.clear()
        return out

    # ================================================================ receipt of client commands

    def _dispatch(self, command: Command) -> None:
        match command:
            case AppendAudio():
                input_turns.append(self, command)
            case StartTurn():
                input_turns.start(self, command)
            case CommitTurn():
                input_turns.commit(self, command)
            case RequestTypedInput():
                self.typed.request(self, command)
            case Configure():
                self._on_configure(command)
            case Stop():
                self._on_stop(command)
            case SubmitFunctionOutput():
                self.functions.submit(self, command)
            case CommitInput():
                input_turns.commit_input(self, command)
            case ClearInput():
                input_turns.clear_input(self, command)
            case CancelResponse():
                # Ahead of queued input: the cancel runs right after the position in flight.
                self.work.appendleft(Cancel(command))
            case RespondNow():
                self.work.append(Respond(command))
            case RespondFirst():
                if not self.configured:
                    self.emit(Error("session_not_configured", "send session.update before asking for a response",
                                    False, command.client_event_id))
                    return
                self.work.append(SpeakFirst(command))
            case _:
                raise TypeError(f"unknown command {command!r}")

    def _dispatch_again(self, commands: list[Command] | None) -> None:
        """Input a function cycle held, handed back when the cycle ended: dispatched in its original order."""
        for command in commands or ():
            self._dispatch(command)

    def _on_configure(self, cmd: Configure) -> None:
        if self.settings_locked or self.input_active:
            self.emit(Error("settings_locked", "session settings are locked after the first model input", False,
                            cmd.client_event_id))
            return
        if self._configs:
            self._configs.append(cmd)  # evaluated once the prefill in progress completes
            return
        if self.prompt is not None and cmd.prompt == self.prompt:
            self.emit(SessionConfigured(cmd.prompt, cmd.client_event_id, restarted=False))
            return
        self._configs.append(cmd)
        self.emit(Prefill(cmd.prompt))

    def _on_stop(self, cmd: Stop) -> None:
        self._move(Move.STOP)
        self.typed.release(self, procedure_ends=False)
        self.work.append(Close(cmd))

    def tune_turn_taking(self, *, auto_eou: bool, eou_blank_frames: int | None) -> None:
        """Model-owned turn taking: whether the blank fence fires the EOU, and the fence (fixed once settings are
        locked)."""
        self.auto_eou = auto_eou
        if eou_blank_frames is not None and not self.settings_locked:
            self.eou_blank_frames = eou_blank_frames

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
            except StopIteration as ended:
                self._proc = None
                self.barrier_running = False
                self._dispatch_again(ended.value)
        return False

    def _next_procedure(self) -> Procedure | None:
        work = self.work
        procs = procedures
        while work:
            item = work[0]
            if type(item) is InjectTyped and item.job.state == "synthesizing":
                return None  # blocked until synthesis is ready; an open response keeps moving meanwhile
            work.popleft()
            match item:
                case MicFrame():
                    return procs.frame(self, PositionKind.REAL, item.pcm, item.transport_frame, item.loud, item.ready,
                                       item.arrived)
                case TailPadding():
                    return procs.frame(self, PositionKind.COMMIT_PADDING, item.pcm, item.transport_frame,
                                       ready=item.ready)
                case EndInput():
                    return procs.end_input(self, item.command)
                case Cancel():
                    return procs.cancel(self, item.command)
                case Respond():
                    return procs.respond(self)
                case SpeakFirst():
                    return procs.speak_first(self, item.command)
                case Reack():
                    self.emit(item.event)
                case OpenTurn():
                    self.barrier_running = True
                    return procs.open_turn(self, item.command, item.turn_id)
                case CommitClientTurn():
                    self.barrier_running = True
                    return procs.commit_turn(self, item.command, item.turn_id)
                case InjectTyped():
                    return procs.typed(self, item.job)
                case Close():
                    return procs.stop(self)
                case Recover():
                    return self.functions.recovery(self, item.cycle)
        return None

    def settlement_takes_audio(self, now: float) -> bool:
        """Whether the next position is a settlement's that a quiet microphone frame queued now would feed, none being
        queued yet: a dialect that holds client frames behind the commit may hand its held appends on (in order,
        stopping at anything else). Chooses the next position's plan if none is chosen (``poll`` would)."""
        if self.closed or self.runner.in_flight is not None or self.functions.cycle is not None:
            return False  # (a function cycle's deadline is checked by ``poll`` before it chooses)
        self.now = now
        if self._plan is None and not self._configs:
            try:
                self._advance()
            except SessionFailure as failure:
                self._failed(failure)
                return False
        plan = self._plan
        return self.settlement_audio and not self.work and plan is not None and plan.queued_audio and not self.closed

    def _settlement_input(self, plan: Plan) -> Plan:
        """A settlement position's input: the quiet microphone frame at the head of the work queue, if there is one.
        Speech, or any item that is not a microphone frame, ends this for the rest of the settlement: it never crosses
        them (the speech runs after the response starts)."""
        work = self.work
        if self.settlement_audio and work:
            head = work[0]
            if type(head) is MicFrame and not head.loud:
                work.popleft()
                # Plans built field by field: dataclasses.replace is ~5x dearer (a settlement position in seven).
                return Plan(plan.kind, head.pcm, plan.controls, head.transport_frame, head.ready, head.arrived, True,
                            False)
            self.settlement_audio = False
        elif self.settlement_audio and (until := self._settlement_wait(plan)) is not None:
            # still queued_audio: the next poll looks again
            return Plan(plan.kind, plan.pcm, plan.controls, plan.transport_frame, until, plan.arrived, plan.input_audio,
                        plan.queued_audio)
        return Plan(plan.kind, plan.pcm, plan.controls, plan.transport_frame, plan.ready, plan.arrived, plan.input_audio,
                    False)

    def _settlement_wait(self, plan: Plan) -> float | None:
        """Until when a settlement position with nothing queued waits for the client's next frame (None: it runs on
        zeros now). It waits only when that frame is expected within ``settlement_await_s`` and the session's last
        audio position ran batched with other sessions', and once."""
        if plan.ready is not None:  # waiting already
            return plan.ready if self.now < plan.ready else None
        window = self.config.settlement_await_s
        last = self.microphone.last_frame_at
        if window <= 0.0 or last is None or not self._audio_batched:
            return None
        if self.now < last + self.config.frame_seconds <= self.now + window:
            return self.now + window
        return None

    def _idle_plan(self) -> Plan | None:
        # An open response, or function-channel work the model is in the middle of, keeps the clock moving.
        conv = self.conversation
        if conv.response is not None or conv.model_busy:
            return Plan(PositionKind.RESPONSE_SILENCE)
        return None

    def inject_next(self, tokens: tuple[str, ...]) -> None:
        """Tool-result tokens ride on the next position."""
        self._next_tokens = tokens

    def eos_next(self) -> None:
        """Agent EOS rides on the next position."""
        self._next_eos = True

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
        self._move(Move.STOP)
        if self.model_started or self._configs or self.configured:
            self.emit(AbortModel())
        # Every typed request gets its answer and every response exactly one terminal before the error (a v3
        # client disconnects on the fatal error itself); the position guard closes its brackets after it.
        self.typed.release(self, procedure_ends=True)
        if brackets is None:
            self.conversation.close_response("failed", code)
        self.emit(Error(code, message, True, client_event_id, details or {}))
        if brackets is not None:
            self.conversation.close_brackets("failed", brackets)
        if closed is not None:
            self.emit(SessionClosed(closed[0], closed[1]))  # type: ignore[arg-type]
        self.close()

    def _failed(self, failure: SessionFailure) -> None:
        """A part raised the session's failure: the one teardown."""
        self._plan = None
        self._fatal(failure.code, failure.message, client_event_id=failure.client_event_id, details=failure.details,
                   closed=failure.closed, brackets=failure.brackets)

    def _fatal_position_limit(self, limit: PositionLimitReached) -> None:
        self._fatal(
            "session_position_limit",
            f"session reached {limit.limit} model positions",
            details={"model_frames": limit.positions, "max_model_frames": limit.limit},
            brackets="session_position_limit",
            closed=("failed", "session_position_limit"),
        )

    def close(self) -> None:
        """The session has ended: drop every piece of queued work."""
        self._move(Move.CLOSE)
        self._reset_work()

    def _move(self, move: Move) -> None:
        self.phase = next_phase(self.phase, move)
        self.closed = self.phase is Phase.CLOSED

    def _reset_work(self) -> None:
        self.work.clear()
        self._configs.clear()
        self.functions.deferred.drain()
        proc, self._proc = self._proc, None
        self.barrier_running = False
        if proc is not None and inspect.getgeneratorstate(proc) != inspect.GEN_RUNNING:
            proc.close()
        self._plan = None
        self.typed.waiting.clear()

    # ================================================================ outputs

    def emit(self, output: Output) -> None:
        self._out.append(output)

    def _drain(self) -> list[Output]:
        out = self._out
        if not out:
            return []
        drained = out.copy()
        out.clear()
        return drained
