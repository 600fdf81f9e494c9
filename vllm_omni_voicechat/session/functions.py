"""Function-call transactions: publication (name mapping, argument coercion, the per-turn budget), result
validation and injection, the output timeout, post-function recovery and the deferred-input FIFO."""

from __future__ import annotations

import hashlib
import json
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..errors import VoicechatError
from ..model.port import AgentControl, StepResult, ToolCall, ToolSpec
from ..model.prompt import wrap_tool_result
from ..runner.stage0 import PositionKind
from .commands import AppendAudio, ClearInput, Command, CommitInput, CommitTurn, StartTurn, SubmitFunctionOutput
from .events import Error, FunctionCallFailed, FunctionCallPublished, FunctionOutputApplied
from .failure import SessionFailure
from .procedures import Plan, Procedure
from .work import Recover

if TYPE_CHECKING:
    from .core import SessionCore

MAX_FUNCTION_CALLS_PER_RESPONSE = 8
FUNCTION_CALL_TIMEOUT_S = 30.0
FUNCTION_OUTPUT_MAX_BYTES = 16_384
FUNCTION_OUTPUT_MAX_TOKENS = 128
FUNCTION_OUTPUT_RECOVERY_MAX_FRAMES = 256
DEFERRED_INPUT_MAX_BYTES = 1 << 20

Tokenizer = Callable[[str], Sequence[str]]


CALL_ID_HEX = 32
"""A call id's hex digits: ``call_<32 hex>``, the v3 reference's convention (ids are opaque to its contract)."""


def call_id_for(session_id: str, n: int, hex_digits: int = CALL_ID_HEX) -> str:
    """``call_<hex>``, unique per session and deterministic (the core stays pure)."""
    return "call_" + hashlib.sha256(f"{session_id}:{n}".encode()).hexdigest()[:hex_digits]


def advertised_name(call_name: str, tools: Sequence[ToolSpec]) -> str:
    """Map the model's (possibly ``_``-normalized) name back to the advertised one."""
    key = call_name.replace("-", "_")
    for tool in tools:
        if tool.name.replace("-", "_") == key:
            return tool.name
    return call_name


def _coerce(value: Any, schema: Any) -> Any:
    if not isinstance(value, str) or not isinstance(schema, dict):
        return value
    kind = schema.get("type")
    try:
        if kind == "integer":
            return int(value.strip())
        if kind == "number":
            number = float(value.strip())
            if not math.isfinite(number):
                return value  # NaN / Infinity are not JSON: keep what the model wrote
            return int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number
        if kind == "boolean" and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
    except ValueError:
        return value
    return value


def arguments_json(call: ToolCall, tools: Sequence[ToolSpec]) -> str:
    """The call's arguments as a compact sorted-key JSON object, numeric/boolean strings coerced to the schema."""
    name = advertised_name(call.name, tools)
    spec = next((t for t in tools if t.name == name), None)
    props = (spec.parameters.get("properties") if spec else None) or {}
    args = {k: _coerce(v, props.get(k)) for k, v in call.arguments.items()}
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(slots=True)
class Cycle:
    """A published function cycle, from publication to ``applied`` / ``failed`` and idle recovery."""

    call_id: str
    name: str
    turn_id: str
    response_id: str
    deadline: float
    state: Literal["awaiting", "recovering"] = "awaiting"
    terminal: Literal["applied", "failed"] = "applied"
    deferred_bos: bool = False


class OutputRejected(VoicechatError, ValueError):
    def __init__(self, message: str, call_id: Any) -> None:
        super().__init__(message)
        self.message = message
        self.call_id = call_id


def result_tokens(
    cycle: Cycle | None,
    call_id: Any,
    output: Any,
    model_output: Any,
    negotiated: bool,
    tokenizer: Tokenizer,
) -> tuple[str, ...]:
    """Validate a client result for the open cycle; the tokens to inject, or :class:`OutputRejected`.

    The request's own shape and negotiation come first, the call lookup last (the reference's order;
    docs/v3-dialect.md, "Function results: the order of checks"): ``output`` a string, ``output`` size,
    ``model_output`` negotiated, ``model_output`` a non-empty string, ``model_output`` size, the injected value's
    token count, then the call id (unknown, completed or duplicate)."""
    if not isinstance(output, str):
        raise OutputRejected("output must be a string", call_id)
    if len(output.encode("utf-8", "surrogatepass")) > FUNCTION_OUTPUT_MAX_BYTES:
        raise OutputRejected(f"output exceeds {FUNCTION_OUTPUT_MAX_BYTES} UTF-8 bytes", call_id)
    value = output
    if model_output is not None:
        if not negotiated:
            raise OutputRejected("model_output was not negotiated (function_output_model_output)", call_id)
        if not isinstance(model_output, str) or not model_output:
            raise OutputRejected("model_output must be a non-empty string", call_id)
        if len(model_output.encode("utf-8", "surrogatepass")) > FUNCTION_OUTPUT_MAX_BYTES:
            raise OutputRejected(f"model_output exceeds {FUNCTION_OUTPUT_MAX_BYTES} UTF-8 bytes", call_id)
        value = model_output
    tokens = tuple(tokenizer(wrap_tool_result(value)))
    if len(tokens) > FUNCTION_OUTPUT_MAX_TOKENS:
        raise OutputRejected(
            f"injected result is {len(tokens)} tokens; maximum is {FUNCTION_OUTPUT_MAX_TOKENS}", call_id
        )
    if cycle is None or cycle.state != "awaiting" or call_id != cycle.call_id:
        raise OutputRejected("unknown or completed call_id", call_id)
    return tokens


@dataclass(slots=True)
class DeferredInput:
    """Microphone commands that arrived while a published cycle was open, replayed in order afterwards."""

    limit: int = DEFERRED_INPUT_MAX_BYTES
    items: deque[Command] = field(default_factory=deque)
    size: int = 0

    def offer(self, command: Command, size: int) -> bool:
        """Hold ``command``; False when it would overflow the byte bound (the session must fail)."""
        if self.size + size > self.limit:
            return False
        self.items.append(command)
        self.size += size
        return True

    def drain(self) -> list[Command]:
        items = list(self.items)
        self.items.clear()
        self.size = 0
        return items


# Microphone input a published cycle holds back until its result is applied (typed requests are refused instead).
HELD_DURING_CYCLE = (AppendAudio, StartTurn, CommitTurn, CommitInput, ClearInput)


class FunctionCycles:
    """The session's function-call transactions: at most one published cycle, the per-user-turn call budget, the
    deferred BOS a tool-bearing EOU may leave pending, and the microphone input held meanwhile. Each step that
    publishes, injects or fails is handed the core it acts on."""

    def __init__(self) -> None:
        self.cycle: Cycle | None = None
        self.deferred = DeferredInput()
        self.pending_bos_turn: str | None = None
        """The user turn whose EOU opened a function cycle: its agent BOS comes after the result."""
        self._published = 0
        self._scope_turn_id: str | None = None
        self._scope_calls = 0

    @property
    def awaiting(self) -> bool:
        """A published call waits for its result (its deadline is a wake-up time)."""
        return self.cycle is not None and self.cycle.state == "awaiting"

    def holds(self, command: Command) -> bool:
        return self.cycle is not None and isinstance(command, HELD_DURING_CYCLE)

    def on_tool_call(self, core: SessionCore, result: StepResult, suppress: bool) -> None:
        """A call completed on the function channel: publish it as a transaction, or refuse it."""
        call = result.tool_call
        assert call is not None
        if suppress:
            # The initiating turn is being cancelled by a new client turn: never shown to the client.
            core.inject_next(tuple(core.config.tokenizer(wrap_tool_result('{"error":"cancelled_by_new_client_turn"}'))))
            return
        if self.cycle is not None:
            raise SessionFailure("internal_error", "a second function cycle overlapped the open one",
                                 closed=("failed", "internal_error"))
        conversation = core.conversation
        response = conversation.response
        turn_id = response.turn_id if response is not None else (conversation.eou_turn_id or conversation.new_turn_id())
        if turn_id != self._scope_turn_id:
            self._scope_turn_id, self._scope_calls = turn_id, 0  # a new user turn starts a fresh budget
        self._scope_calls += 1
        self._published += 1
        call_id = call_id_for(core.session_id, self._published, core.config.call_id_hex)
        limit = core.config.max_function_calls_per_response
        if self._scope_calls > limit:
            raise SessionFailure(
                "function_call_loop_limit",
                f"more than {limit} function calls in one user turn",
                details={"call_id": call_id, "attempt": self._scope_calls, "limit": limit},
                closed=("failed", "function_call_loop_limit"),
            )
        if response is None:
            response = conversation.open_response(turn_id)
        tools = core.prompt.tools if core.prompt else ()
        name = advertised_name(call.name, tools)
        self.cycle = Cycle(
            call_id=call_id,
            name=name,
            turn_id=turn_id,
            response_id=response.response_id,
            deadline=core.now + core.config.function_call_timeout_s,
            deferred_bos=self.pending_bos_turn is not None,
        )
        self.pending_bos_turn = None
        core.emit(FunctionCallPublished(turn_id, response.response_id, call_id, name, arguments_json(call, tools)))

    def submit(self, core: SessionCore, cmd: SubmitFunctionOutput) -> None:
        try:
            tokens = result_tokens(
                self.cycle, cmd.call_id, cmd.output, cmd.model_output, cmd.model_output_negotiated,
                core.config.tokenizer,
            )
        except OutputRejected as rejected:
            # Recoverable: the call stays pending, a corrected resubmission can still complete it.
            core.emit(Error("invalid_function_call_output", rejected.message, False, cmd.client_event_id,
                            {"call_id": rejected.call_id}))
            return
        cycle = self.cycle
        assert cycle is not None
        self._start_recovery(core, cycle, tokens)

    def check_deadline(self, core: SessionCore, now: float) -> list[Command]:
        """No result in time: ``function_call.failed``, the model is told so, held input replays (returned for the
        core to dispatch again)."""
        cycle = self.cycle
        if cycle is None or cycle.state != "awaiting" or now < cycle.deadline:
            return []
        core.emit(FunctionCallFailed(cycle.turn_id, cycle.response_id, cycle.call_id, "function_call_output_timeout"))
        if cycle.deferred_bos:
            # The reference invalidates the call's function epoch before failing; its detail is always present:
            # null when the invalidation succeeded, else its message. Here the epoch is the cycle itself, dropped
            # by the fatal teardown (the cycle and its deferred input are cleared), which cannot fail.
            invalidation_error = self._invalidate_epoch(cycle)
            raise SessionFailure(
                "function_call_output_timeout",
                f"no result for {cycle.call_id} within {core.config.function_call_timeout_s:g} s (deferred BOS pending)",
                details={"call_id": cycle.call_id, "epoch_invalidation_error": invalidation_error},
            )
        cycle.terminal = "failed"
        tokens = tuple(core.config.tokenizer(wrap_tool_result('{"error":"function_call_output_timeout"}')))
        self._start_recovery(core, cycle, tokens)
        # `failed` is the call's terminal for the client: turn state is restored now and held input replays
        # (queued behind the recovery positions that feed the model its error result).
        return self._finish(core, cycle)

    def _invalidate_epoch(self, cycle: Cycle) -> str | None:
        """End ``cycle``'s function epoch (no result will ever be injected); its failure message, or None."""
        if self.cycle is not cycle:
            return f"the function epoch of {cycle.call_id} was not the open one"
        self.cycle = None
        self.pending_bos_turn = None
        return None

    def _start_recovery(self, core: SessionCore, cycle: Cycle, tokens: tuple[str, ...]) -> None:
        cycle.state = "recovering"
        core.inject_next(tokens)
        core.work.appendleft(Recover(cycle))

    def recovery(self, core: SessionCore, cycle: Cycle) -> Procedure:
        """Zero-input positions at >= 80 ms until the cycle is idle (and a deferred BOS arrived), then ack; returns the
        input the cycle held, for the core to dispatch again."""
        for _ in range(core.config.function_recovery_max_frames):
            result = yield Plan(PositionKind.RECOVERY)
            core.conversation.publish(core, result)
            fn = result.function
            if cycle.deferred_bos:
                if result.agent.control is AgentControl.AGENT_BOS:
                    cycle.deferred_bos = False
                elif not fn.busy and not fn.post_fc_bos_pending:
                    raise SessionFailure("missing_post_fc_terminal_bos",
                                         "the function cycle ended without the deferred agent BOS",
                                         details={"call_id": cycle.call_id})
            if not fn.busy and not cycle.deferred_bos:
                return self._finish(core, cycle)
        raise SessionFailure(
            "function_output_apply_timeout",
            f"post-function recovery not idle within {core.config.function_recovery_max_frames} positions",
            details={"call_id": cycle.call_id},
        )

    def _finish(self, core: SessionCore, cycle: Cycle) -> list[Command]:
        """End ``cycle``; the input it held, in its original order, for the core to dispatch again."""
        if self.cycle is not cycle:
            return []  # already finished (a timed-out cycle ends at `failed`)
        self.cycle = None
        if cycle.terminal == "applied":
            core.emit(FunctionOutputApplied(cycle.call_id))
        return self.deferred.drain()

    def defer(self, core: SessionCore, command: Command) -> None:
        size = getattr(command, "wire_bytes", 0) or (len(command.pcm) if isinstance(command, AppendAudio) else 64)
        if not self.deferred.offer(command, size):
            raise SessionFailure(
                "deferred_input_overflow",
                f"more than {self.deferred.limit} bytes of input held during a function cycle",
                client_event_id=getattr(command, "client_event_id", None),
            )
