"""E2E feasibility: our server (v3 + tiered) -> OmniStage0Port (ModelPort) -> DuplexOmni session -> real
DuplexSessionManager/runner/DuplexOrchestrator -> fake stage engines whose Stage-0 is scripted by our
SimulatorModel (controls read from the append envelope), Stage-2 emits the simulator's audio later."""
import os
import asyncio, base64, collections, dataclasses, json, queue, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
t0 = time.time()
import numpy as np
from harness import *
from fakes import eco, raw
from vllm_omni.engine.duplex.commands import AppendAudio
from vllm_omni.entrypoints.duplex.audio_encoding import encode_audio
from vllm_omni_voicechat.omni.plugin import VoiceChatDuplexPlugin
from vllm_omni_voicechat.model.port import (PositionControls, PositionInput, SessionPrompt, StepResult, ToolSpec, ModelError)
from vllm_omni_voicechat.sim.model import SimulatorModel
from vllm_omni_voicechat.server import ServerConfig
from tests.server_fixture import running_app, RawClient
from tests.compat import load_duplex_client_module
from vllm_omni_voicechat.audio.speech import render_speech, decode_speech
print(f"imports {time.time()-t0:.1f}s")

class Tok:
    def encode(self, text, add_special_tokens=False): return [1000 + (ord(c) % 500) for c in text]
    def decode(self, ids, skip_special_tokens=True): return ""
SPECIAL = {"nvc_text_bos_id": BOS, "nvc_text_eos_id": EOS, "nvc_text_pad_id": PAD, "nvc_function_sotc_id": 20,
           "nvc_function_eotc_id": 21, "nvc_function_eotr_id": 22, "nvc_tokenizer_ref": "fake/tok"}

# ---------------- plugin-side Stage-0 bus (engine-scoped, lives in the plugin instance) ----------------
class Channel:
    def __init__(self): self.controls = collections.deque(); self.tokens = queue.Queue(); self.audio = queue.Queue()
class Bus:
    def __init__(self): self.by_session = {}; self.lock = threading.Lock()
    def open(self, sid):
        with self.lock: return self.by_session.setdefault(sid, Channel())
    def close(self, sid):
        with self.lock: self.by_session.pop(sid, None)
    def for_request(self, rid):
        from vllm_omni.engine.duplex.contracts import duplex_resource_request_belongs_to_session
        with self.lock:
            for sid, ch in self.by_session.items():
                if duplex_resource_request_belongs_to_session(rid, sid): return ch
class BusDataPlane(type(VoiceChatDuplexPlugin(encode_audio).data_plane)):
    bus = None
    def project(self, result, *, context=None):
        for out in result.get("data_plane_outputs", []):
            if getattr(out, "stage_id", None) == 2:
                ch = self.bus.for_request(out.request_id)
                if ch is not None: ch.audio.put((out.multimodal_output or {}).get("audio"))
        return iter(())
class BusPlugin(VoiceChatDuplexPlugin):
    def __init__(self, encode_audio):
        super().__init__(encode_audio)
        self.bus = Bus(); self.data_plane = BusDataPlane(encode_audio); self.data_plane.bus = self.bus
        self._nemotron.data_plane = self.data_plane
    def plan_append(self, **kw):
        plan = super().plan_append(**kw)
        ch = self.bus.for_request(kw["request_id"])
        ctrl = ch.controls.popleft() if ch and ch.controls else {}
        plan.prompt["model_intermediate_buffer"]["duplex"]["vc"] = ctrl        # our per-position model fields
        return plan
    def decide_output(self, **kw):
        if kw["stage_id"] == 0:
            ch = self.bus.for_request(kw["output"].request_id)
            if ch is not None: ch.tokens.put((tuple(kw["segment_token_ids"]), dict(kw["segment_output_metadata"])))
        return super().decide_output(**kw)

plugin = BusPlugin(encode_audio)
async def fake_rt(mc): return dict(SPECIAL), Tok()
plugin._tokenizer_runtime = fake_rt

# ---------------- fake stage engines scripted by the simulator ----------------
sims = {}
def script_stage0(fx):
    def on_add(request):
        d = request.model_intermediate_buffer["duplex"]; rid = request.request_id
        rt = d["runtime_config"]
        if rid not in sims:
            tools = tuple(ToolSpec(**t) for t in json.loads(rt.get("nvc_tools_signature") or "[]"))
            sims[rid] = SimulatorModel(); sims[rid].prefill(SessionPrompt(rt.get("instructions", ""), tools))
        vc = dict(d.get("vc") or {}); synthetic = vc.pop("synthetic", False)
        f32 = np.frombuffer(base64.b64decode(d["payload"]["audio"]), "<f4")
        pcm16 = np.clip(np.rint(f32 * 32768.0), -32768, 32767).astype("<i2").tobytes()
        res = sims[rid].step(PositionInput(pcm16, PositionControls(**vc), synthetic=synthetic))
        tok = res.agent.token_id if res.agent.token_id is not None else PAD
        meta = {"nvc_function_token": [PAD], "vc_result": dataclasses.replace(res, audio=b"")}  # evidence metadata
        loop = asyncio.get_running_loop()
        loop.call_soon(lambda: fx.clients[0].emit(raw(eco(rid, [tok], meta))))
        audio = np.frombuffer(res.audio, "<i2").astype("<f4") / 32768.0
        loop.call_later(0.004, lambda: fx.clients[2].emit(raw(eco(rid, [], {"audio": audio, "sr": 22050}))))
    return on_add

fx = build(plugin, max_sessions=4)
fx.clients[0].on_add = script_stage0(fx)

# ---------------- our ModelPort over the DuplexOmni session surface ----------------
class OmniStage0Port:
    def __init__(self, omni, loop, timeout=10.0):
        self.omni, self.loop, self.timeout = omni, loop, timeout; self.handle = None; self.ch = None
    def _run(self, coro): return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout)
    def prefill(self, prompt):
        if self.handle is not None: self.abort()
        tools = [dataclasses.asdict(t) for t in prompt.tools]
        payload = {"modalities": ["audio", "text"], "input_audio_format": "pcm_f32le", "instructions": prompt.instructions,
                   "extra_body": {"auto_response": True, "realtime_tools": tools}}
        self.handle = self._run(self.omni.open_session(payload))
        self.ch = plugin.bus.open(self.handle.session_id)
        async def drain():
            async for ev in self.handle.events():
                if type(ev).__name__ == "ErrorEvent": self.ch.tokens.put(ev)   # fail the waiting step
        asyncio.run_coroutine_threadsafe(drain(), self.loop)
    def step(self, position):
        self.ch.controls.append({**dataclasses.asdict(position.controls), "synthetic": position.synthetic})
        f32 = (np.frombuffer(position.pcm, "<i2").astype("<f4") / 32768.0).tobytes()
        self._run(self.handle.submit(AppendAudio(audio=f32, format="pcm_f32le", sample_rate_hz=16000)))
        item = self.ch.tokens.get(timeout=self.timeout)
        if not isinstance(item, tuple): raise ModelError(f"stage-0 append failed: {item}")
        toks, meta = item
        audio = self.ch.audio.get(timeout=self.timeout)              # lag 0: join this position's audio
        pcm16 = np.clip(np.rint(np.asarray(audio) * 32768.0), -32768, 32767).astype("<i2").tobytes()
        return dataclasses.replace(meta["vc_result"], audio=pcm16)
    def abort(self):
        if self.handle is None: return
        h, self.handle = self.handle, None
        plugin.bus.close(h.session_id)
        self._run(h.close())

def factory():
    return OmniStage0Port(fx.omni, asyncio.get_running_loop())

cfg = ServerConfig(model_kind="vllm-omni", model_factory=factory, settlement_blank_frames=3, max_sessions=4, warmup_positions=2)
with running_app(cfg) as (url, server):
    print("warmup:", server.warmup)
    # --- v3 raw client turn
    c = RawClient(url + "/v1/voicechat", timeout=20)
    assert c.recv()["type"] == "session.created"
    c.send({"type": "session.update", "event_id": "u1", "session": {"protocol_version": 3, "instructions": "Be brief."}})
    c.recv_type("session.updated")
    c.send({"type": "input_audio_buffer.turn_start", "event_id": "s1", "client_turn_id": 1})
    c.send({"type": "input_audio_buffer.append", "event_id": "a1", "encoding": "pcm16", "sample_rate": 16000, "channels": 1,
            "audio": base64.b64encode(render_speech("hello")).decode()})
    c.send({"type": "input_audio_buffer.commit", "event_id": "c1", "client_turn_id": 1})
    evs = c.recv_until(lambda e: e["type"] == "response.done")
    audio = b"".join(base64.b64decode(e["delta"]) for e in evs if e["type"] == "response.output_audio.delta")
    print("v3 types:", [e["type"] for e in evs if e["type"] != "response.output_audio.delta"][-8:])
    print("v3 decoded reply:", repr(decode_speech(audio, 22050)) if audio else None, "| audio deltas", sum(e["type"] == "response.output_audio.delta" for e in evs))
    c.close()
    # --- DuplexClient turn on the tiered route
    dc = load_duplex_client_module()
    async def duplex_turn():
        async with dc.DuplexClient(url, model="m", reconnect=None, heartbeat_interval_s=None) as cl:
            await cl.stream_pcm(render_speech("hello") + bytes(2 * 3200), chunk_ms=80, realtime=False)
            await cl.commit()
            async for h in cl.responses():
                if h.decision == "listen" and h.response_id is None: continue
                pcm = b"".join([x async for x in h.audio()]); await h.wait(20)
                return h.transcript, decode_speech(pcm, 24000), h.done_event.raw["response"]["status"]
    print("DuplexClient:", asyncio.run(asyncio.wait_for(duplex_turn(), 60)))
    time.sleep(0.3)
print("stage0 submits:", len(fx.clients[0].requests), "stage0 aborts:", len(fx.clients[0].aborted),
      "request_states left:", len(fx.orch.request_states), "bus channels left:", len(plugin.bus.by_session))
