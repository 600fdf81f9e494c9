"""API keys on the standalone server: vLLM's rule (Bearer on /v1, constant-time), the browser
subprotocol form, refusals before any session state, and the open routes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from vllm_omni_voicechat.cli import api_keys
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.server.auth import ApiKeys, guarded, safe_subprotocol, subprotocol_key

from .server_fixture import running_app

KEYS = ("k-one", "k-two")


def test_keys_match_exactly_and_only_non_empty_keys_count():
    keys = ApiKeys(["a", "", "b"])
    assert len(keys) == 2 and keys.matches("a") and keys.matches("b")
    assert not keys.matches("ab") and not keys.matches("") and not keys.matches(None)
    with pytest.raises(ValueError):
        ApiKeys(["", ""])


def test_the_subprotocol_forms():
    offered = ["realtime", "openai-insecure-api-key.sk-1", "openai-beta.realtime-v1"]
    assert subprotocol_key(offered) == "sk-1" and safe_subprotocol(offered) == "realtime"
    assert subprotocol_key(["realtime"]) is None and safe_subprotocol(["openai-insecure-api-key.x"]) is None


@pytest.mark.parametrize(("scope", "expected"), [
    ({"type": "websocket", "path": "/v1/voicechat"}, True),
    ({"type": "http", "method": "GET", "path": "/v1/usage"}, True),
    ({"type": "http", "method": "OPTIONS", "path": "/v1/usage"}, False),
    ({"type": "http", "method": "GET", "path": "/health"}, False),
    ({"type": "http", "method": "GET", "path": "/metrics"}, False),
    ({"type": "http", "method": "GET", "path": "/"}, False),
    ({"type": "http", "method": "GET", "path": "/api/v1/usage", "root_path": "/api"}, True),
    ({"type": "lifespan"}, False),
])
def test_what_is_guarded(scope, expected):
    assert guarded(scope) is expected


def test_flags_take_precedence_over_the_environment(monkeypatch):
    monkeypatch.setenv("VOICECHAT_API_KEY", "from-env")
    assert api_keys(None) == ("from-env",)
    assert api_keys(["a", "b"]) == ("a", "b")
    monkeypatch.delenv("VOICECHAT_API_KEY")
    assert api_keys(None) == ()


def http(url: str, path: str, key: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url.replace("ws://", "http://") + path,
                                     headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def refused(url: str, **kw) -> int:
    with pytest.raises(InvalidStatus) as caught:
        connect(url, open_timeout=10, ping_interval=None, proxy=None, **kw)
    return caught.value.response.status_code


def first_event(url: str, **kw) -> tuple[dict, str | None]:
    with connect(url, open_timeout=10, ping_interval=None, proxy=None, **kw) as ws:
        return json.loads(ws.recv(timeout=10)), ws.subprotocol


def test_no_route_under_v1_is_reachable_without_a_key_and_a_refusal_holds_nothing():
    with running_app(ServerConfig.simulator(max_sessions=1, api_keys=KEYS)) as (url, server):
        for path in ("/v1/voicechat", "/v1/duplex", "/v1/realtime?model=sim"):
            assert refused(url + path) == 401  # no header, no subprotocol key
            assert refused(url + path, additional_headers={"Authorization": "Bearer wrong"}) == 401
            assert refused(url + path, subprotocols=["realtime", "openai-insecure-api-key.wrong"]) == 401
        assert server.admission.active == 0 and not server.usage.admitted  # refused before any session state
        for path in ("/v1/usage", "/v1/sessions"):
            assert http(url, path) == (401, {"error": "Unauthorized"})
            assert http(url, path, "k-two")[0] == 200
        status, health = http(url, "/health")
        assert status == 200 and health["auth_required"] is True
        with urllib.request.urlopen(url.replace("ws://", "http://") + "/metrics", timeout=10) as response:
            assert response.status == 200  # as vLLM's /metrics: outside /v1


def test_the_right_key_by_header_or_by_subprotocol_opens_a_session():
    with running_app(ServerConfig.simulator(max_sessions=2, api_keys=KEYS)) as (url, _):
        event, protocol = first_event(url + "/v1/voicechat", additional_headers={"Authorization": "Bearer k-one"})
        assert event["type"] == "session.created" and protocol is None
        event, protocol = first_event(url + "/v1/realtime?model=sim",
                                      subprotocols=["realtime", "openai-insecure-api-key.k-two"])
        assert event["type"] == "session.created" and protocol == "realtime"  # the credential is never echoed


def test_without_keys_the_browser_form_is_still_answered_with_its_safe_protocol():
    with running_app(ServerConfig.simulator()) as (url, _):
        event, protocol = first_event(url + "/v1/voicechat", subprotocols=["realtime"])
        assert event["type"] == "session.created" and protocol == "realtime"
        assert http(url, "/health")[1]["auth_required"] is False
