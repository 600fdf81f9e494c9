"""``record``: a frozen, slotted dataclass whose ``__init__`` is ~3x cheaper, for the values made every position.

A frozen dataclass sets each field through ``object.__setattr__`` looked up by name (~150 ns a field): the
~18 records made per 80 ms position (tick, step result, metrics, ...) cost more to build than to use. ``record``
generates the same ``__init__`` (signature, defaults, default factories) setting each slot through its member
descriptor instead. Everything else is the dataclass's own: equality, hash, repr, ``FrozenInstanceError`` on
assignment, ``dataclasses.replace``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")

class _Factory:
    """The default of a field with a default factory (call the factory); shown as dataclasses shows it."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def record(cls: type[T]) -> type[T]:
    """``@dataclass(frozen=True, slots=True)`` with the faster ``__init__`` (dataclass's own where a field is
    keyword-only or not in ``__init__``, or the class has ``__post_init__``)."""
    cls = dataclasses.dataclass(frozen=True, slots=True)(cls)
    fields = dataclasses.fields(cls)
    if hasattr(cls, "__post_init__") or any(not f.init or f.kw_only for f in fields):
        return cls
    namespace: dict[str, Any] = {"_FACTORY": _FACTORY}
    params, body = [], []
    for f in fields:
        namespace[f"_set_{f.name}"] = getattr(cls, f.name).__set__
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_FACTORY")
            body.append(f"    if {f.name} is _FACTORY: {f.name} = _factory_{f.name}()")
        else:
            params.append(f.name)
        body.append(f"    _set_{f.name}(self, {f.name})")
    source = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body or ["    pass"]) + "\n"
    exec(compile(source, f"<record {cls.__qualname__}>", "exec"), namespace)  # noqa: S102 - as dataclasses does
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    cls.__init__ = init  # type: ignore[misc]
    return cls
