"""Tool definitions from a client's configuration: validation and normalization (dialect-neutral).

Accepts OpenAI-style ``{"type": "function", "function": {name, description, parameters}}``, OpenAI GA
``{"type": "function", name, description, parameters}`` and NVIDIA-style ``{name, description, parameters}``
entries; at most 32; names match ``^[A-Za-z_][A-Za-z0-9_-]{0,127}$`` and
stay unique after mapping ``-`` to ``_``; ``parameters`` is an object (default: an empty object schema).
"""

from __future__ import annotations

import re
from typing import Any

from ..model.port import ToolSpec

MAX_TOOLS = 32
TOOL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,127}$")


class InvalidTools(ValueError):
    """The tool list is invalid; the message says why (sent as ``invalid_tools``)."""


def normalize_tools(tools: Any) -> tuple[ToolSpec, ...]:
    if not isinstance(tools, list):
        raise InvalidTools("tools must be a list")
    if len(tools) > MAX_TOOLS:
        raise InvalidTools(f"at most {MAX_TOOLS} tools are allowed, got {len(tools)}")
    specs: list[ToolSpec] = []
    seen: dict[str, str] = {}
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
        specs.append(ToolSpec(name, description, parameters))
    return tuple(specs)


def tool_to_dict(tool: ToolSpec) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
