"""Function-call transactions: publication (name mapping, argument coercion), result validation, the cycle
record and the deferred-input FIFO. Pure helpers used by the session core."""

from __future__ import annotations

import hashlib
import json
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..model.port import ToolCall, ToolSpec
from ..model.prompt import wrap_tool_result
from .commands import Command

MAX_FUNCTION_CALLS_PER_RESPONSE = 8
FUNCTION_CALL_TIMEOUT_S = 30.0
FUNCTION_OUTPUT_MAX_BYTES = 16_384
FUNCTION_OUTPUT_MAX_TOKENS = 128
FUNCTION_OUTPUT_RECOVERY_MAX_FRAMES = 256
DEFERRED_INPUT_MAX_BYTES = 1 << 20

Tokenizer = Callable[[str], Sequence[str]]


def call_id_for(session_id: str, n: int) -> str:
    """``call_<32 hex>``, unique per session and deterministic (the core stays pure)."""
    return "call_" + hashlib.sha256(f"{session_id}:{n}".encode()).hexdigest()[:32]


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


class OutputRejected(ValueError):
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
    """Validate a client result for the open cycle; the tokens to inject, or :class:`OutputRejected`."""
    if cycle is None or cycle.state != "awaiting" or call_id != cycle.call_id:
        raise OutputRejected("unknown or completed call_id", call_id)
    if not isinstance(output, str):
        raise OutputRejected("output must be a string", call_id)
    if len(output.encode()) > FUNCTION_OUTPUT_MAX_BYTES:
        raise OutputRejected(f"output exceeds {FUNCTION_OUTPUT_MAX_BYTES} UTF-8 bytes", call_id)
    value = output
    if model_output is not None:
        if not negotiated:
            raise OutputRejected("model_output was not negotiated (function_output_model_output)", call_id)
        if not isinstance(model_output, str) or not model_output:
            raise OutputRejected("model_output must be a non-empty string", call_id)
        if len(model_output.encode()) > FUNCTION_OUTPUT_MAX_BYTES:
            raise OutputRejected(f"model_output exceeds {FUNCTION_OUTPUT_MAX_BYTES} UTF-8 bytes", call_id)
        value = model_output
    tokens = tuple(tokenizer(wrap_tool_result(value)))
    if len(tokens) > FUNCTION_OUTPUT_MAX_TOKENS:
        raise OutputRejected(
            f"injected result is {len(tokens)} tokens; maximum is {FUNCTION_OUTPUT_MAX_TOKENS}", call_id
        )
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
