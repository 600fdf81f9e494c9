"""Our routes mounted in the app vLLM-Omni's ``vllm-omni serve`` builds, on vLLM-Omni's real orchestrator over
fake stage engines: a v3 client and ``DuplexClient`` each complete a turn end to end.

The app is assembled the way ``omni_run_server_worker`` does it (``build_openai_app``, route removal,
``include_router(router)``, ``app.state``), without starting stage processes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.util
import logging
import os
import socket
import threading
import time

import pytest

assert os.environ.get("VLLM_TARGET_DEVICE"), "tests/conftest.py sets it before vllm is imported"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or importlib.util.find_spec("vllm_omni") is None,
    reason="vllm_omni is not installed (create an omni venv with scripts/install_omni_cpu.sh)",
)


PING_S = 0.01


@contextlib.contextmanager
def serve(app):
    import uvicorn

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    # As vLLM's serve_http: uvicorn's WebSocket keepalive left on (there 20 s / 20 s; here every PING_S, so that any
    # turn would meet pings) and the server published as app.state.server (vllm/entrypoints/launchers/launcher.py).
    server = uvicorn.Server(uvicorn.Config(app, ws_ping_interval=PING_S, ws_ping_timeout=PING_S, log_level="warning"))
    app.state.server = server
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        thread.join(0.01)
    try:
        yield f"ws://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture(scope="module")
def mounted():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm_omni.entrypoints.openai import api_server
    from vllm_omni.entrypoints.serve.utils.routes import remove_route_from_app

    from vllm_omni_voicechat.omni.mount import VoicechatMount, install

    from .omni_fake_engine import build_fake_engine, simulator_respond, voicechat_plugin

    plugin = voicechat_plugin()
    engine = build_fake_engine(plugin, max_sessions=4, respond=simulator_respond(), audio_delay_s=0.004)
    agent_port = _free_port()
    # As a replica behind HAProxy (deploy/haproxy/README.md): its name in full-lane ids, the agent answering
    mount = VoicechatMount(plugin, settlement_blank_frames=3, warmup_positions=2, replica="r1", agent_port=agent_port)
    assert install(mount)  # the private seam: vLLM-Omni's module-level router, before the app includes it
    assert not install(mount)  # idempotent

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "m"])
    app = api_server.build_openai_app(args, ("generate",))
    app.state.api_server_count = 1
    for path, methods in (("/v1/chat/completions", {"POST"}), ("/v1/models", {"GET"}), ("/health", {"GET"})):
        remove_route_from_app(app, path, methods)
    app.include_router(api_server.router)
    app.state.engine_client = engine.omni
    app.state.openai_serving_models = None
    app.state.openai_serving_duplex = None
    app.state.log_stats = False
    with serve(app) as url:
        yield url, app, mount, engine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_replica_inside_vllm_omni_serve_answers_haproxys_agent_and_names_itself(mounted):
    import json
    import urllib.request

    url, _, mount, _ = mounted
    health = json.load(urllib.request.urlopen(url.replace("ws://", "http://") + "/health", timeout=10))
    assert health["replica"] == {"name": "r1", "draining": False, "free_slots": 4}
    with socket.create_connection(("127.0.0.1", mount.server.config.agent_port), timeout=10) as s:
        assert s.recv(64) == b"100%\n"
    from websockets.sync.client import connect

    with connect(url + "/v1/duplex", open_timeout=10, proxy=None) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(ws.recv(timeout=10))["session"]["id"].startswith("duplex-r1-")


def test_replica_settings_come_from_the_block_or_the_environment():
    from vllm_omni_voicechat.omni.settings import VoicechatSettingsError, environment_settings, parse_block

    assert parse_block({"replica": "r2", "agent_port": 9102}) == {"replica": "r2", "agent_port": 9102}
    assert environment_settings({"VOICECHAT_REPLICA": "r3", "VOICECHAT_AGENT_PORT": "9103",
                                 "VOICECHAT_AGENT_HOST": "0.0.0.0"}) == {
        "replica": "r3", "agent_port": 9103, "agent_host": "0.0.0.0"}
    assert environment_settings({}) == {}
    with pytest.raises(VoicechatSettingsError, match="voicechat.replica"):
        parse_block({"replica": "R-1"})
    with pytest.raises(VoicechatSettingsError, match="VOICECHAT_AGENT_PORT must be an integer"):
        environment_settings({"VOICECHAT_AGENT_PORT": "x"})


def test_our_routes_come_first_and_the_warmup_ran_through_the_engine(mounted):
    url, app, _, _ = mounted
    order = [r.path for r in app.routes if r.path in ("/health", "/v1/realtime", "/v1/duplex", "/v1/voicechat")]
    assert order[:4] == ["/health", "/v1/realtime", "/v1/duplex", "/v1/voicechat"]
    import json
    import urllib.request

    health = json.load(urllib.request.urlopen(url.replace("ws://", "http://") + "/health", timeout=10))
    assert health["model_kind"] == "vllm-omni" and health["warmup"]["positions"] == 2
    assert health["max_sessions"] == 4
    assert health["status"] == "ready" and health["engine"] == "healthy"  # vLLM-Omni's check_health passed


def test_the_engine_probe_is_vllm_omnis_check_health():
    """A dead stage fails vLLM-Omni's check_health (``EngineDeadError``): /health says failed with its words."""
    from vllm.v1.engine.exceptions import EngineDeadError

    from vllm_omni_voicechat.omni.mount import engine_failure

    class Engine:
        def __init__(self, error=None):
            self.error = error

        async def check_health(self):
            if self.error is not None:
                raise self.error

    dead = Engine(EngineDeadError("Stage-1 has no live replica"))
    assert asyncio.run(engine_failure(Engine())) is None
    assert asyncio.run(engine_failure(object())) is None  # an engine client without the check
    assert asyncio.run(engine_failure(dead)) == "vLLM-Omni's engine is not healthy: Stage-1 has no live replica"


def test_the_plugin_takes_its_bounds_from_the_same_settings_as_the_server(mounted):
    """One source of truth: the plugin's own position backstop and fence are the mount's settings (the YAML's
    voicechat: block under explicit ones), not the plugin's built-in defaults."""
    from vllm_omni_voicechat.omni.plugin import VC_MAX_SESSION_MODEL_FRAMES, VC_SETTLEMENT_BLANK_FRAMES

    _, _, mount, _ = mounted
    assert mount.plugin.runtime_defaults[VC_SETTLEMENT_BLANK_FRAMES] == 3 == mount.server.config.settlement_blank_frames
    assert (mount.plugin.runtime_defaults[VC_MAX_SESSION_MODEL_FRAMES]
            == mount.server.config.max_session_model_frames)


def test_a_v3_client_completes_a_turn_through_the_mounted_route(mounted):
    url, *_ = mounted
    v3_turn(url)


def v3_turn(url: str) -> float:
    """One spoken v3 turn through the mounted route; returns how long the session lasted."""
    from vllm_omni_voicechat.audio.speech import decode_speech, render_speech

    from .server_fixture import RawClient

    t0 = time.monotonic()
    c = RawClient(url + "/v1/voicechat", timeout=30)
    try:
        assert c.recv()["type"] == "session.created"
        c.send({"type": "session.update", "event_id": "u1", "session": {"protocol_version": 3,
                                                                       "instructions": "Be brief."}})
        c.recv_type("session.updated")
        c.send({"type": "input_audio_buffer.turn_start", "event_id": "s1", "client_turn_id": 1})
        c.send({"type": "input_audio_buffer.append", "event_id": "a1", "encoding": "pcm16", "sample_rate": 16000,
                "channels": 1, "audio": base64.b64encode(render_speech("hello")).decode()})
        c.send({"type": "input_audio_buffer.commit", "event_id": "c1", "client_turn_id": 1})
        events = c.recv_until(lambda e: e["type"] in ("response.done", "error"))
    finally:
        c.close()
    audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    assert (events[-1]["type"], events[-1]["status"]) == ("response.done", "completed")
    assert decode_speech(audio, 22_050) == "You said: hello."
    return time.monotonic() - t0


def test_no_keepalive_ping_reaches_a_v3_client(mounted, caplog):
    """The v3 contract: no protocol pings. vLLM's serve_http turns uvicorn's keepalive on; the mount turns it off
    (app.state.server's config) before the first accept, so a whole turn sees no PING frame."""
    mount = mounted[2]
    assert mount.pings_off
    caplog.set_level(logging.DEBUG, logger="websockets.client")  # websockets logs every frame it receives
    took = v3_turn(mounted[0])
    assert took > 10 * PING_S  # long enough that a keepalive left on would have pinged
    frames = [r.getMessage() for r in caplog.records if r.name == "websockets.client" and r.getMessage()[:2] == "< "]
    assert any(f.startswith("< TEXT") for f in frames)  # the log does show the frames received
    assert not [f for f in frames if f.startswith("< PING")]


def test_duplex_client_completes_a_turn_through_the_mounted_route(mounted):
    from vllm_omni_voicechat.audio.speech import decode_speech, render_speech

    from .compat import load_duplex_client_module

    dc = load_duplex_client_module()
    url, *_ = mounted

    async def turn():
        async with dc.DuplexClient(url, model="m", reconnect=None, heartbeat_interval_s=None) as client:
            await client.stream_pcm(render_speech("hello") + bytes(2 * 3200), chunk_ms=80, realtime=False)
            await client.commit()
            async for handle in client.responses():
                if handle.decision == "listen" and handle.response_id is None:
                    continue
                pcm = b"".join([chunk async for chunk in handle.audio()])
                await handle.wait(30)
                return handle, pcm
        raise AssertionError("no response")

    handle, pcm = asyncio.run(asyncio.wait_for(turn(), 90))
    assert handle.done_event.raw["response"]["status"] == "completed"
    assert handle.transcript == "You said: hello."
    assert decode_speech(pcm, 24_000) == "You said: hello."


def test_the_plugin_mounts_our_routes_only_inside_vllm_omni_serve(monkeypatch):
    import sys
    import types

    from fastapi import APIRouter
    from vllm_omni.entrypoints.duplex.audio_encoding import encode_audio

    from vllm_omni_voicechat.omni.mount import API_SERVER_MODULE
    from vllm_omni_voicechat.omni.plugin import VoiceChatDuplexPlugin

    fake_api = types.SimpleNamespace(router=APIRouter())
    monkeypatch.setitem(sys.modules, API_SERVER_MODULE, fake_api)
    monkeypatch.setattr(sys, "argv", ["pytest"])
    VoiceChatDuplexPlugin(encode_audio)
    assert fake_api.router.routes == []  # not a serve process: nothing mounted
    monkeypatch.setattr(sys, "argv", ["vllm-omni", "serve", "m", "--omni"])
    VoiceChatDuplexPlugin(encode_audio)
    assert [r.path for r in fake_api.router.routes] == ["/health", "/v1/sessions", "/v1/usage", "/v1/realtime",
                                                        "/v1/duplex", "/v1/voicechat", "/", "/ui/{name}"]
    VoiceChatDuplexPlugin(encode_audio)  # a second load mounts nothing more
    assert len(fake_api.router.routes) == 8


def test_the_built_in_page_is_served_through_vllm_omnis_app(mounted):
    import urllib.request

    url, app, _, _ = mounted
    assert [r.path for r in app.routes if r.path in ("/", "/ui/{name}")] == ["/", "/ui/{name}"]
    base = url.replace("ws://", "http://")
    with urllib.request.urlopen(base + "/", timeout=10) as r:
        assert r.headers["Content-Type"] == "text/html; charset=utf-8"
        assert '<script type="module" src="/ui/app.js"></script>' in r.read().decode()
    with urllib.request.urlopen(base + "/ui/capture-worklet.js", timeout=10) as r:
        assert r.headers["Content-Type"] == "text/javascript; charset=utf-8"
        assert b'registerProcessor("voicechat-capture", CaptureProcessor)' in r.read()


def test_our_metrics_are_on_vllms_own_metrics_route_and_usage_is_ours(mounted):
    """vLLM's /metrics (its Prometheus registry, the process default with one API server) carries our series next to
    vLLM's own; /v1/usage and /v1/sessions are our routes."""
    import json
    import urllib.request

    url, app, mount, _ = mounted
    v3_turn(url)
    http = url.replace("ws://", "http://")
    metrics = urllib.request.urlopen(http + "/metrics", timeout=10).read().decode()
    assert "/metrics" not in [r.path for r in mount.routes()]  # the route that answered is vLLM's
    assert "http_requests_total" in metrics  # vLLM's instrumentator, in the same exposition
    assert 'voicechat_sessions_admitted_total{dialect="v3"}' in metrics
    assert 'voicechat_responses_total{dialect="v3",status="completed"}' in metrics
    usage = json.load(urllib.request.urlopen(http + "/v1/usage", timeout=10))
    assert usage["sessions"]["admitted"]["v3"] == mount.server.usage.admitted["v3"] >= 1
    sessions = json.load(urllib.request.urlopen(http + "/v1/sessions", timeout=10))
    assert sessions["max_sessions"] == 4
