"""The model's system prompt: instructions plus NVIDIA's function-calling tool block and a grounding paragraph.

The tool list is sorted-key JSON inside ``<AVAILABLE_TOOLS>...</AVAILABLE_TOOLS>``; calls are
``<TOOLCALL>[{"name": ..., "arguments": {...}}]</TOOLCALL>`` and results come back as
``<TOOL_RESPONSE>[...]</TOOL_RESPONSE>``. Model homes render this text and tokenize it for the prefill.
"""

from __future__ import annotations

import json

from .port import SessionPrompt, ToolCall, ToolSpec

TOOLS_OPEN = "<AVAILABLE_TOOLS>"
TOOLS_CLOSE = "</AVAILABLE_TOOLS>"
TOOL_RESPONSE_OPEN = "<TOOL_RESPONSE>["
TOOL_RESPONSE_CLOSE = "]</TOOL_RESPONSE>"

GROUNDING = (
    "Call a tool only when the user's request needs it. After a tool response arrives, answer the user and "
    "include the exact returned result."
)


def render_system_prompt(prompt: SessionPrompt) -> str:
    if not prompt.tools:
        return prompt.instructions
    tools = [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in prompt.tools]
    block = (
        "You can call the following tools when they help.\n"
        f"{TOOLS_OPEN}{_tools_json(tools)}{TOOLS_CLOSE}\n"
        'To call tools, write <TOOLCALL>[{"name": "<tool name>", "arguments": {<arguments object>}}]</TOOLCALL>; '
        "you may list several calls, chain calls, or correct a call after its result.\n"
        f"Each result comes back as {TOOL_RESPONSE_OPEN}<result>{TOOL_RESPONSE_CLOSE}."
    )
    parts = [p for p in (prompt.instructions, block, GROUNDING) if p]
    return "\n\n".join(parts)


def _tools_json(tools: list[dict]) -> str:
    # Every "<" becomes the JSON escape u+003C, so no description can open or close the block.
    return json.dumps(tools, sort_keys=True, separators=(",", ":")).replace("<", "\\u003c")


def tools_from_prompt(text: str) -> tuple[ToolSpec, ...]:
    """The tool block a rendered prompt offers (what a model honouring the prompt can call).

    The block follows the instructions, so the last opening tag is the real one even when the instructions
    quote the tag.
    """
    start = text.rfind(TOOLS_OPEN)
    if start < 0:
        return ()
    end = text.find(TOOLS_CLOSE, start)
    if end < 0:
        return ()
    body = json.loads(text[start + len(TOOLS_OPEN) : end])
    return tuple(ToolSpec(t["name"], t.get("description", ""), t.get("parameters", {})) for t in body)


def wrap_tool_result(value: str) -> str:
    """The injected form of a tool result: JSON values stay JSON, anything else becomes a JSON string."""
    try:
        parsed = json.loads(value)
    except ValueError:
        body = json.dumps(value, ensure_ascii=False)
    else:
        body = json.dumps(parsed, ensure_ascii=False, separators=(",", ":"))
    return f"{TOOL_RESPONSE_OPEN}{body}{TOOL_RESPONSE_CLOSE}"


def parse_tool_call(payload: str) -> ToolCall | None:
    """The first call of a function-channel ``<TOOLCALL>[{"name": ..., "arguments": ...}]</TOOLCALL>`` payload
    (arguments as an object or a JSON string); None when malformed."""
    body = payload.strip().removeprefix("<TOOLCALL>").removesuffix("</TOOLCALL>")
    try:
        first = json.loads(body)[0]
        args = first.get("arguments", {})
        if isinstance(args, str):
            args = json.loads(args)
        return ToolCall(str(first["name"]), dict(args), payload)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
