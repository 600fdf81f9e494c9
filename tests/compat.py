"""Optional third-party clients for compatibility tests (docs/tiered-dialect.md §7, §11.2, §11.3).

Both helpers skip the calling test when their package is missing, so the plain dev venv stays green:

- :func:`load_duplex_client_module` returns vLLM-Omni 0.30.0's own ``vllm_omni.clients.duplex``, unmodified.
  Install it with ``pip install --no-deps vllm-omni==0.30.0`` (an 8 MB wheel; ``duplex.py`` needs only the
  stdlib, ``pybase64`` and ``websockets``, all of which we already depend on).
- :func:`validate_openai_server_event` / :func:`is_ga_event_type` use the GA realtime types of
  ``openai==3.57.0``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
import typing
from typing import Any

import pytest

DUPLEX_MODULE = "vllm_omni.clients.duplex"
STUB_MARKER = "__vllm_omni_voicechat_stub__"


# --------------------------------------------------------------------------- vLLM-Omni DuplexClient


def _namespace_stub(name: str, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
    """A bare package module whose ``__path__`` is the real one: submodules import, ``__init__`` never runs."""
    stub = types.ModuleType(name)
    stub.__path__ = list(spec.submodule_search_locations or ())
    setattr(stub, STUB_MARKER, True)
    return sys.modules.setdefault(name, stub)


def load_duplex_client_module() -> types.ModuleType:
    """``vllm_omni.clients.duplex`` (vLLM-Omni 0.30.0), or ``pytest.skip`` when vllm-omni is not installed.

    Without ``vllm`` the real ``vllm_omni/__init__.py`` cannot run (and with it, it costs ~20 s of torch
    imports), so the top-level package is replaced by a namespace stub (§11.3). ``vllm_omni/clients/__init__.py``
    is only a docstring, so it is imported for real. With ``vllm`` importable nothing is stubbed.
    """
    if DUPLEX_MODULE in sys.modules:
        return sys.modules[DUPLEX_MODULE]
    spec = importlib.util.find_spec("vllm_omni")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vllm-omni is not installed (pip install --no-deps vllm-omni==0.30.0)", allow_module_level=True)
    if importlib.util.find_spec("vllm") is None:
        _namespace_stub("vllm_omni", spec)
    return importlib.import_module(DUPLEX_MODULE)


def vllm_omni_is_stubbed() -> bool:
    """Whether ``vllm_omni`` in ``sys.modules`` is our namespace stub (``__init__`` never ran)."""
    return getattr(sys.modules.get("vllm_omni"), STUB_MARKER, False)


# --------------------------------------------------------------------------- openai GA realtime types


def _union_members(tp: Any) -> list[Any]:
    """The concrete classes in a (possibly ``Annotated``/nested) ``Union``."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _union_members(typing.get_args(tp)[0])
    if origin is typing.Union or origin is types.UnionType:
        return [m for arg in typing.get_args(tp) for m in _union_members(arg)]
    return [tp]


def _literal_values(tp: Any) -> list[str]:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return [v for v in typing.get_args(tp) if isinstance(v, str)]
    if origin is typing.Annotated or origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(tp)[:1] if origin is typing.Annotated else typing.get_args(tp)
        return [v for arg in args for v in _literal_values(arg)]
    return []


def _openai_realtime_server_event() -> Any:
    pytest.importorskip("openai", reason="openai is not installed (pip install openai==3.57.0)")
    from openai.types.realtime import RealtimeServerEvent

    return RealtimeServerEvent


@functools.cache
def _ga_models_by_type() -> dict[str, type]:
    by_type: dict[str, type] = {}
    for member in _union_members(_openai_realtime_server_event()):
        field = getattr(member, "model_fields", {}).get("type")
        if field is None:
            raise AssertionError(f"RealtimeServerEvent member {member!r} has no `type` field")
        for value in _literal_values(field.annotation):
            by_type[value] = member
    if not by_type:
        raise AssertionError("found no literal `type` values in openai.types.realtime.RealtimeServerEvent")
    return by_type


@functools.cache
def _server_event_adapter():
    union = _openai_realtime_server_event()  # skips when openai is missing; openai requires pydantic
    from pydantic import TypeAdapter

    return TypeAdapter(union)


def ga_event_types() -> frozenset[str]:
    """Every ``type`` literal of ``openai.types.realtime.RealtimeServerEvent`` (derived, not hard-coded)."""
    return frozenset(_ga_models_by_type())


def is_ga_event_type(event_type: str) -> bool:
    """Whether ``event_type`` is a server event type of the OpenAI GA realtime union."""
    return event_type in _ga_models_by_type()


def validate_openai_server_event(event: dict[str, Any]) -> Any:
    """Validate one server event against ``openai.types.realtime.RealtimeServerEvent``; return the model.

    Raises ``AssertionError`` carrying pydantic's message. The openai union has no pydantic discriminator, so a
    failure is re-validated against the member named by ``type`` for a focused message. Note that openai's models
    allow extra keys: this checks types and required fields, not the absence of non-GA fields.
    """
    adapter = _server_event_adapter()  # skips when openai is missing
    from pydantic import ValidationError

    try:
        return adapter.validate_python(event)
    except ValidationError as union_error:
        event_type = event.get("type") if isinstance(event, dict) else None
        member = _ga_models_by_type().get(event_type) if isinstance(event_type, str) else None
        if member is None:
            raise AssertionError(f"{event_type!r} is not an OpenAI GA realtime server event type: {event!r}") from None
        try:
            member.model_validate(event)
        except ValidationError as member_error:
            raise AssertionError(f"invalid {event_type} ({member.__name__}):\n{member_error}") from None
        raise AssertionError(f"invalid {event_type}:\n{union_error}") from None


class CuttableTransport:
    """A real websockets connection for ``DuplexClient``'s ``connect=`` seam that a test can cut: the socket is
    aborted (no close handshake), as a dropped network would."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    async def send(self, data: Any) -> None:
        await self.ws.send(data)

    async def recv(self) -> Any:
        return await self.ws.recv()

    async def close(self) -> None:
        await self.ws.close()

    def cut(self) -> None:
        self.ws.transport.abort()
