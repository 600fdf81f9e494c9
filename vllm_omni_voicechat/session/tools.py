"""Tool definitions from a client's configuration: validation and normalization (dialect-neutral).

Accepts OpenAI-style ``{"type": "function", "function": {name, description, parameters}}``, OpenAI GA
``{"type": "function", name, description, parameters}`` and NVIDIA-style ``{name, description, parameters}``
entries; at most 32; names match ``^[A-Za-z_][A-Za-z0-9_-]{0,127}$`` and
stay unique after mapping ``-`` to ``_``; ``parameters`` is an object (default: an empty object schema). Each tool
is at most ``MAX_TOOL_BYTES`` of JSON and all of them ``MAX_TOOLS_BYTES``: the tools are rendered into the model's
prompt, and the real model's prompt holds ~3,800 tokens (deploy/voicechat.yaml), ~16 KB of English.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..errors import VoicechatError
from ..model.port import ToolSpec

MAX_TOOLS = 32
MAX_TOOL_BYTES = 16 << 10
MAX_TOOLS_BYTES = 64 << 10
TOOL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,127}$")


class InvalidTools(VoicechatError, ValueError):
    """The tool list is invalid; the message says why (sent as ``invalid_tools``)."""


def normalize_tools(tools: Any) -> tuple[ToolSpec, ...]:
    if not isinstance(tools, list):
        raise InvalidTools("tools must be a list")
    if len(tools) > MAX_TOOLS:
        raise InvalidTools(f"at most {MAX_TOOLS} tools are allowed, got {len(tools)}")
    specs: list[ToolSpec] = []
    seen: dict[str, str] = {}
    total = 0
    for i, entry in enumerate(tools):
        if not isinstance(entry, dict):
            raise InvalidTools(f"tools[{i}] must be an object")
        body = entry
        if entry.get("type", "function") != "function" or ("function" in entry and not isinstance(entry["function"], dict)):
            raise InvalidTools(f'tools[{i}] must be {{"type": "function", "function": {{...}}}} or {{name, ...}}')
        if "function" in entry:
            body = entry["function"]
        name = body.get("name")
        if not isinstance(name, str) or not TOOL_NAME_RE.fullmatch(name):
            raise InvalidTools(f"tools[{i}].name must match {TOOL_NAME_RE.pattern}")
        key = name.replace("-", "_")
        if key in seen:
            raise InvalidTools(f"tool names {seen[key]!r} and {name!r} collide after mapping '-' to '_'")
        seen[key] = name
        description = body.get("description", "")
        if description is None:
            description = ""
        if not isinstance(description, str):
            raise InvalidTools(f"tools[{i}].description must be a string")
        parameters = body.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise InvalidTools(f"tools[{i}].parameters must be an object")
        size = _json_bytes(name, description, parameters)
        if size > MAX_TOOL_BYTES:
            raise InvalidTools(f"tools[{i}] is {size} bytes of JSON; at most {MAX_TOOL_BYTES}")
        total += size
        if total > MAX_TOOLS_BYTES:
            raise InvalidTools(f"the tools are over {MAX_TOOLS_BYTES} bytes of JSON")
        specs.append(ToolSpec(name, description, parameters))
    return tuple(specs)


def _json_bytes(name: str, description: str, parameters: dict) -> int:
    try:
        text = json.dumps([name, description, parameters], ensure_ascii=False)
    except (TypeError, ValueError):  # not JSON after all (a NaN is fine: the decoder accepted it)
        raise InvalidTools("a tool is not JSON") from None
    return len(text.encode("utf-8", "surrogatepass"))


def tool_to_dict(tool: ToolSpec) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
