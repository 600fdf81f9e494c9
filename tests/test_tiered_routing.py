"""Dialect selection on the upgrade request (docs/tiered-dialect.md §1.1)."""

from __future__ import annotations

import itertools
import json

import pytest

from vllm_omni_voicechat.wire.tiered.routing import (
    BARE_DEFAULTS,
    DUPLEX_OFF_ANSWER,
    DUPLEX_OFF_CLOSE_CODE,
    Route,
    UnknownRoute,
    duplex_off_answer_text,
    select_route,
)

DUPLEX_VALUES = ["1", "TRUE", "true", "on", "On", "0", "off", "false", "yes", "", None]
DUPLEX_ON = {"1", "true", "on"}


def _expected(path, duplex, model, beta, default):
    """An independent statement of the §1.1 table: (dialect, lane)."""
    if path == "/v1/voicechat":
        return ("v3", None)
    if path == "/v1/duplex":
        return ("tiered", "full")
    if duplex is not None:
        return ("tiered", "full") if duplex.lower() in DUPLEX_ON else ("duplex_off", None)
    if model or beta:
        return ("tiered", "openai")
    return {"v3": ("v3", None), "tiered": ("tiered", "full"), "tiered-openai": ("tiered", "openai")}[default]


@pytest.mark.parametrize(
    "path,duplex,model,beta,default",
    list(
        itertools.product(
            ["/v1/voicechat", "/v1/duplex", "/v1/realtime"],
            DUPLEX_VALUES,
            [False, True],
            [False, True],
            BARE_DEFAULTS,
        )
    ),
)
def test_matrix(path, duplex, model, beta, default):
    query = {}
    if duplex is not None:
        query["duplex"] = duplex
    if model:
        query["model"] = "sim"
    headers = {"OpenAI-Beta": "realtime=v1"} if beta else {}
    route = select_route(path, query, headers, bare_default=default)
    assert (route.dialect, route.lane) == _expected(path, duplex, model, beta, default)
    if route.dialect != "tiered":
        assert (route.autostart, route.resume_only, route.model) == (False, False, None)
    else:
        assert route.model == ("sim" if model else None)
        assert route.autostart == model


def test_duplex_beats_model_like_duplex_client():
    route = select_route("/v1/realtime", {"duplex": "1", "model": "m", "autostart": "0"}, {})
    assert route == Route("tiered", "full", autostart=False, resume_only=True, model="m")
    assert route.tier3 and route.is_tiered


@pytest.mark.parametrize("name", ["OpenAI-Beta", "openai-beta", "OPENAI-BETA"])
def test_beta_header_case_insensitive(name):
    route = select_route("/v1/realtime", {}, {name: "realtime=v1"})
    assert (route.dialect, route.lane, route.autostart) == ("tiered", "openai", False)
    assert not route.tier3


def test_model_query_autostarts_openai_lane():
    route = select_route("/v1/realtime", {"model": "gpt-realtime"}, {})
    assert route == Route("tiered", "openai", autostart=True, resume_only=False, model="gpt-realtime")


def test_empty_model_is_openai_lane_without_autostart():
    route = select_route("/v1/realtime", {"model": ""}, {})
    assert (route.dialect, route.lane, route.autostart, route.model) == ("tiered", "openai", False, None)


@pytest.mark.parametrize(
    "query,autostart,resume_only",
    [
        ({"model": "m"}, True, False),
        ({"model": "m", "autostart": "0"}, False, True),
        ({"model": "m", "autostart": "no"}, False, True),
        ({"model": "m", "autostart": "1"}, True, False),
        ({"model": "m", "resume": "1"}, False, True),
        ({"model": "m", "resume": "True"}, False, True),
        ({"model": "m", "resume": "0"}, True, False),
        ({"resume": "1"}, False, True),
        ({}, False, False),
    ],
)
def test_handshake_flags(query, autostart, resume_only):
    route = select_route("/v1/duplex", query, {})
    assert (route.autostart, route.resume_only) == (autostart, resume_only)


def test_trailing_slash_and_query_in_path():
    assert select_route("/v1/duplex/", {}, {}).lane == "full"
    assert select_route("/v1/voicechat?x=1", {}, {}).dialect == "v3"


def test_unknown_path_and_bad_default():
    with pytest.raises(UnknownRoute):
        select_route("/v1/other", {}, {})
    with pytest.raises(ValueError, match="bare_default"):
        select_route("/v1/realtime", {}, {}, bare_default="openai")


def test_duplex_off_answer():
    assert json.loads(duplex_off_answer_text()) == {
        "type": "error",
        "error": "Realtime API is not available",
        "code": "unsupported",
    }
    assert dict(DUPLEX_OFF_ANSWER) == json.loads(duplex_off_answer_text())
    assert DUPLEX_OFF_CLOSE_CODE == 1000


def test_route_is_frozen():
    route = select_route("/v1/voicechat", {}, {})
    with pytest.raises(AttributeError):
        route.dialect = "tiered"  # type: ignore[misc]
