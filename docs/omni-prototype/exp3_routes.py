"""How our routes can be mounted in the app `vllm-omni serve` builds (api_server.omni_run_server_worker order)."""
import os
import sys, time, json, asyncio, contextlib
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
t0 = time.time()
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm_omni.entrypoints.openai import api_server as omni_api
from vllm_omni.entrypoints.serve.utils.routes import remove_route_from_app
from starlette.routing import WebSocketRoute, Route
from starlette.testclient import TestClient
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.server.app import create_app
print(f"imports {time.time()-t0:.1f}s")

ours = create_app(ServerConfig.simulator(prefill_delay_s=0.0, warmup_positions=0))
server = ours.state.voicechat
calls = []

# --- approach R: insert our routes at the FRONT of vllm_omni's module-level router before include_router ---
router = omni_api.router
print("omni router websocket paths:", [r.path for r in router.routes if type(r).__name__.endswith("WebSocketRoute")])
mine = [Route("/health", server.health), WebSocketRoute("/v1/realtime", server.realtime),
        WebSocketRoute("/v1/duplex", server.realtime), WebSocketRoute("/v1/voicechat", server.v3)]
router.routes[0:0] = mine
orig_lifespan = router.lifespan_context
@contextlib.asynccontextmanager
async def our_lifespan(app):
    calls.append(("lifespan", type(app).__name__, hasattr(app.state, "engine_client")))
    async with orig_lifespan(app) as st:
        yield st
router.lifespan_context = our_lifespan

parser = make_arg_parser(FlexibleArgumentParser())
args = parser.parse_args(["--model", "m", "--middleware", "mw_probe.Probe"])
print("args.middleware:", args.middleware)
app = omni_api.build_openai_app(args, ("generate",))
app.state.api_server_count = 1
for path, methods in (("/v1/chat/completions", {"POST"}), ("/v1/chat/completions/batch", {"POST"}), ("/v1/models", {"GET"}), ("/health", {"GET"})):
    remove_route_from_app(app, path, methods)
app.include_router(router)      # api_server.py: after build_async_omni -> our plugin already loaded
class FakeEngine:
    async def check_health(self): return None
app.state.engine_client = FakeEngine(); app.state.openai_serving_models = None; app.state.log_stats = False
class OmniDuplexSentinel:
    async def handle_realtime_session(self, ws):
        calls.append("omni_duplex_handler"); await ws.accept(); await ws.close()
app.state.openai_serving_duplex = OmniDuplexSentinel(); app.state.duplex_warmup_done = None
print("route order:", [(type(r).__name__, r.path) for r in app.routes if r.path in ("/health", "/v1/realtime", "/v1/duplex", "/v1/voicechat", "/v1/models")])
with TestClient(app) as client:
    h = client.get("/health"); print("GET /health", h.status_code, sorted(h.json())[:6])
    m = client.get("/v1/models"); print("GET /v1/models", m.status_code, m.json())
    with client.websocket_connect("/v1/voicechat") as ws:
        print("/v1/voicechat first event:", json.loads(ws.receive_text())["type"])
    with client.websocket_connect("/v1/realtime?duplex=1&model=m&autostart=0") as ws:
        ws.send_text(json.dumps({"type": "session.update", "session": {"modalities": ["audio", "text"]}}))
        print("/v1/realtime?duplex=1 first event:", json.loads(ws.receive_text())["type"])
    with client.websocket_connect("/v1/duplex") as ws:
        ws.send_text(json.dumps({"type": "session.update", "session": {}}))
        print("/v1/duplex first event:", json.loads(ws.receive_text())["type"])
import mw_probe
print("calls:", calls, "| middleware saw:", mw_probe.seen[:6])
