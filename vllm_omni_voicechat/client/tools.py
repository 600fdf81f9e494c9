"""Running a client-side tool handler: bounded by the client's tool timeout, its result normalized, a timeout or
an exception turned into the output the model is told."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from .contract import ToolRun

TOOL_HANDLER_TIMEOUT = 20.0  # Pipecat's own tool handler timeout (the server waits 30 s)
TOOL_TIMEOUT_OUTPUT = '{"error":"tool_handler_timeout"}'

ToolResult = str | tuple[str, str | None]
ToolHandler = Callable[[dict[str, Any]], Awaitable[ToolResult]]


def tool_result(result: Any) -> tuple[str, str | None]:
    """A handler's return value as ``(output, model_output)``."""
    if isinstance(result, str):
        return result, None
    if (
        isinstance(result, tuple)
        and len(result) == 2
        and isinstance(result[0], str)
        and (result[1] is None or isinstance(result[1], str))
    ):
        return result[0], result[1]
    raise TypeError(f"a tool handler must return str or (output, model_output), not {type(result).__name__}")


async def call_tool(run: ToolRun, handler: ToolHandler, timeout: float) -> tuple[str, str | None]:
    """Run ``handler`` for ``run`` within ``timeout``; what to send back (``run`` records a timeout or an error)."""
    try:
        try:
            async with asyncio.timeout(timeout) as scope:
                result = await handler(dict(run.arguments))
            return tool_result(result)
        except TimeoutError:
            if not scope.expired():
                raise
            run.timed_out = True
            return TOOL_TIMEOUT_OUTPUT, None
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - a failing tool is reported to the model, not to the session
        run.error = exc
        return json.dumps({"error": "tool_handler_failed", "type": type(exc).__name__}, separators=(",", ":")), None
