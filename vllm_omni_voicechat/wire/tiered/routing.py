"""Dialect selection on the WebSocket upgrade request (docs/tiered-dialect.md §1.1): pure, no sockets.

:func:`select_route` looks at the path, the query parameters and the headers of the upgrade request and
returns a :class:`Route`:

====  =============================================================  ==========================================
 #    Request                                                        Route
====  =============================================================  ==========================================
 1    ``/v1/voicechat``                                              ``v3``
 2    ``/v1/duplex`` (any query)                                     ``tiered``, full lane
 3    ``/v1/realtime?duplex=V``, ``V.lower()`` in {1, true, on}      ``tiered``, full lane
 4    ``/v1/realtime?duplex=V``, any other value                     ``duplex_off``: send
                                                                     :data:`DUPLEX_OFF_ANSWER`, close 1000
 5    ``/v1/realtime`` with ``model`` in the query or an             ``tiered``, OpenAI lane (Tiers 1-2)
      ``OpenAI-Beta`` header (no ``duplex``)
 6    bare ``/v1/realtime``                                          ``bare_default``: ``v3`` | ``tiered`` |
                                                                     ``tiered-openai``
====  =============================================================  ==========================================

``duplex=1`` beats ``model`` (``DuplexClient`` sends both). Header names are case-insensitive.

Handshake flags (0.30 ``realtime_input.py`` semantics), for tiered routes:

* ``resume_only``: ``resume`` is true-ish or ``autostart`` is false-ish: never autostart, wait for the first
  message (which may be ``session.resume``);
* ``autostart``: a non-empty ``model`` is in the query and not ``resume_only``: open a default session at once
  and send ``session.created`` before any read. Otherwise the first-message handshake applies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ...errors import VoicechatError

__all__ = [
    "BARE_DEFAULTS",
    "DUPLEX_OFF_ANSWER",
    "DUPLEX_OFF_CLOSE_CODE",
    "DUPLEX_PATH",
    "REALTIME_PATH",
    "VOICECHAT_PATH",
    "Dialect",
    "LaneName",
    "Route",
    "UnknownRoute",
    "duplex_off_answer_text",
    "select_route",
]

Dialect = Literal["v3", "tiered", "duplex_off"]
LaneName = Literal["full", "openai"]

VOICECHAT_PATH = "/v1/voicechat"
DUPLEX_PATH = "/v1/duplex"
REALTIME_PATH = "/v1/realtime"

#: Accepted values of ``bare_default`` (the server's ``--realtime-default``).
BARE_DEFAULTS: tuple[str, ...] = ("v3", "tiered", "tiered-openai")

#: The seed's flat answer to ``/v1/realtime?duplex=0`` (sent after ``accept()``, then close 1000).
DUPLEX_OFF_ANSWER: Mapping[str, str] = {
    "type": "error",
    "error": "Realtime API is not available",
    "code": "unsupported",
}
DUPLEX_OFF_CLOSE_CODE = 1000

_DUPLEX_ON = frozenset({"1", "true", "on"})  # §1.1 rule 3: anything else turns duplex off
_TRUE_VALUES = frozenset({"1", "true", "yes", "on"})
_FALSE_VALUES = frozenset({"0", "false", "no", "off"})


class UnknownRoute(VoicechatError, ValueError):
    """The path is none of the routed WebSocket paths."""


@dataclass(frozen=True)
class Route:
    """Where an upgrade request goes.

    ``lane`` is ``None`` for the ``v3`` and ``duplex_off`` dialects. ``autostart``, ``resume_only`` and
    ``model`` matter only for ``tiered``; they are always ``False``/``False``/``None`` for the others.
    """

    dialect: Dialect
    lane: LaneName | None = None
    autostart: bool = False
    resume_only: bool = False
    model: str | None = None

    @property
    def is_tiered(self) -> bool:
        return self.dialect == "tiered"

    @property
    def tier3(self) -> bool:
        """Whether Tier 3 (duplex-only) server events may be sent: the full lane only."""
        return self.lane == "full"


def duplex_off_answer_text() -> str:
    """The JSON text of :data:`DUPLEX_OFF_ANSWER`."""
    return json.dumps(dict(DUPLEX_OFF_ANSWER), separators=(",", ":"))


def _norm(value: object) -> str:
    return str(value).strip().lower()


def _has_header(headers: Mapping[str, str], name: str) -> bool:
    lname = name.lower()
    return any(str(k).lower() == lname for k in headers.keys())


def _tiered(lane: LaneName, query: Mapping[str, str]) -> Route:
    model = query.get("model")
    model = model if isinstance(model, str) and model else None
    resume_only = _norm(query.get("resume")) in _TRUE_VALUES or _norm(query.get("autostart")) in _FALSE_VALUES
    return Route(
        dialect="tiered",
        lane=lane,
        autostart=model is not None and not resume_only,
        resume_only=resume_only,
        model=model,
    )


def select_route(
    path: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    *,
    bare_default: str = "v3",
) -> Route:
    """Select the dialect and lane for an upgrade request (§1.1). Raises :class:`UnknownRoute` for any other
    path and ``ValueError`` for a bad ``bare_default``."""
    if bare_default not in BARE_DEFAULTS:
        raise ValueError(f"bare_default must be one of {', '.join(BARE_DEFAULTS)}; got {bare_default!r}")
    p = path.split("?", 1)[0]
    if len(p) > 1:
        p = p.rstrip("/")
    if p == VOICECHAT_PATH:
        return Route(dialect="v3")
    if p == DUPLEX_PATH:
        return _tiered("full", query)
    if p != REALTIME_PATH:
        raise UnknownRoute(f"no WebSocket route for path {path!r}")
    if "duplex" in query:
        if _norm(query["duplex"]) in _DUPLEX_ON:
            return _tiered("full", query)
        return Route(dialect="duplex_off")
    if "model" in query or _has_header(headers, "OpenAI-Beta"):
        return _tiered("openai", query)
    if bare_default == "v3":
        return Route(dialect="v3")
    return _tiered("full" if bare_default == "tiered" else "openai", query)
