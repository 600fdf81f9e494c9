"""Our routes inside ``vllm-omni serve --api-key``: vLLM's own middleware guards them, and a
browser's subprotocol key reaches it. The app is vLLM-Omni's, built as ``omni_run_server_worker`` builds it, with
``--api-key``, over the fake stage engines; our routes on a router of their own."""

from __future__ import annotations

import importlib.util
import json
import os
import urllib.error
import urllib.request

import pytest

assert os.environ.get("VLLM_TARGET_DEVICE"), "tests/conftest.py sets it before vllm is imported"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or importlib.util.find_spec("vllm_omni") is None,
    reason="vllm_omni is not installed (create an omni venv with scripts/install_omni_cpu.sh)",
)

KEY = "sk-mounted"


@pytest.fixture(scope="module")
def keyed():
    from fastapi import APIRouter
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm_omni.entrypoints.openai import api_server
    from vllm_omni.entrypoints.serve.utils.routes import remove_route_from_app

    from vllm_omni_voicechat.omni.mount import VoicechatMount, install

    from .omni_fake_engine import build_fake_engine, simulator_respond, voicechat_plugin
    from .test_omni_mount import serve

    plugin = voicechat_plugin()
    engine = build_fake_engine(plugin, max_sessions=2, respond=simulator_respond(), audio_delay_s=0.004)
    mount = VoicechatMount(plugin, settlement_blank_frames=3)
    router = APIRouter()
    assert install(mount, router)
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "m", "--api-key", KEY])
    app = api_server.build_openai_app(args, ("generate",))
    assert [m.cls.__name__ for m in app.user_middleware].count("AuthenticationMiddleware") == 1  # vLLM's own
    app.state.api_server_count = 1
    for path, methods in (("/v1/chat/completions", {"POST"}), ("/v1/models", {"GET"}), ("/health", {"GET"})):
        remove_route_from_app(app, path, methods)  # as omni_run_server_worker does
    app.include_router(router)
    app.state.engine_client = engine.omni
    app.state.openai_serving_models = None
    app.state.openai_serving_duplex = None
    app.state.log_stats = False
    with serve(app) as url:
        yield url, mount


def test_vllms_key_guards_our_routes_before_any_session(keyed):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    url, mount = keyed
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        with pytest.raises(InvalidStatus) as caught:
            connect(url + "/v1/voicechat", additional_headers=headers, open_timeout=10, proxy=None)
        assert caught.value.response.status_code == 401
    assert mount.server.admission.active == 0 and not mount.server.usage.admitted
    http = url.replace("ws://", "http://")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(http + "/v1/usage", timeout=10)
    assert caught.value.code == 401
    health = json.load(urllib.request.urlopen(http + "/health", timeout=10))  # open, and says keys are checked
    assert health["auth_required"] is True


def test_the_key_by_header_or_by_the_browser_subprotocol_opens_a_session(keyed):
    from websockets.sync.client import connect

    url, _ = keyed
    with connect(url + "/v1/voicechat", additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=10,
                 proxy=None) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
    with connect(url + "/v1/realtime?model=sim", subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"],
                 open_timeout=10, proxy=None) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        assert ws.subprotocol == "realtime"
