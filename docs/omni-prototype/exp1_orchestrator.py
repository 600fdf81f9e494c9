"""Real DuplexOrchestrator + DuplexSessionManager + DuplexOmniEngine control surface over fake stage engines."""
import os
import asyncio, sys, threading, time, queue
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
t0 = time.time()
import numpy as np, janus
from types import SimpleNamespace
from fakes import *
from vllm_omni.config.stage_config import DuplexSessionRuntimeConfig
from vllm_omni.engine.stage_pool import StagePool
from vllm_omni.engine.duplex_orchestrator import DuplexOrchestrator
from vllm_omni.engine.duplex_omni_engine import DuplexOmniEngine
from vllm_omni.engine.rpc_result_router import CorrelatedRpcClient
from vllm_omni.engine.duplex.commands import AppendAudio
from vllm_omni.engine.duplex.messages import DuplexSessionEventMessage
from vllm_omni.entrypoints.duplex_omni import DuplexOmni
from vllm_omni.entrypoints.duplex.audio_encoding import encode_audio
from vllm_omni_voicechat.omni.plugin import VoiceChatDuplexPlugin
print(f"imports {time.time()-t0:.1f}s")

class Tok:
    def encode(self, text, add_special_tokens=False): return [1000 + (ord(c) % 500) for c in text]
    def decode(self, ids, skip_special_tokens=True): return "".join(chr(97 + (i % 26)) for i in ids)
SPECIAL = {"nvc_text_bos_id": BOS, "nvc_text_eos_id": EOS, "nvc_text_pad_id": PAD, "nvc_function_sotc_id": 20,
           "nvc_function_eotc_id": 21, "nvc_function_eotr_id": 22, "nvc_tokenizer_ref": "fake/tok"}

plugin = VoiceChatDuplexPlugin(encode_audio)
async def fake_rt(model_config): return dict(SPECIAL), Tok()
plugin._tokenizer_runtime = fake_rt
# tap the data plane
projected = []
orig_project = plugin.data_plane.project
def tap(result, *, context=None):
    outs = list(orig_project(result, context=context))
    projected.append((threading.current_thread().name, [getattr(o, 'request_id', None) for o in result.get('data_plane_outputs', [])], outs))
    return iter(outs)
plugin.data_plane.project = tap

params = stage_params()
clients = [FakeLLMClient(0, final_output=False, params=params[0]), FakeLLMClient(1, final_output=False, params=params[1]),
           FakeLLMClient(2, final_output=True, params=params[2])]
mc = SimpleNamespace(max_model_len=8192, hf_config=SimpleNamespace(stt_cfg={}))
pools = [StagePool(i, [c], output_processor=FakeOutputProcessor(), stage_vllm_config=SimpleNamespace(model_config=mc)) for i, c in enumerate(clients)]

SCRIPT = {1: PAD, 2: PAD, 3: BOS, 4: 1500, 5: 1501, 6: EOS, 7: PAD}
def on_stage0(request):
    d = request.model_intermediate_buffer["duplex"]
    seq = d["seq"]; rid = request.request_id
    tok = SCRIPT.get(seq, PAD)
    loop = asyncio.get_running_loop()
    clients[0].emit(raw(eco(rid, [tok], {"nvc_function_token": [PAD]})))
    loop.call_later(0.03, lambda: clients[2].emit(raw(eco(rid, [], {"audio": np.full(1764, 0.01*seq, np.float32), "sr": 22050}))))
clients[0].on_add = on_stage0

rq, oq, rpcq = janus.Queue(maxsize=1024), janus.Queue(), janus.Queue()
ready = threading.Event(); holder = {}
def boot():
    loop = asyncio.new_event_loop(); asyncio.set_event_loop(loop)
    async def main():
        orch = DuplexOrchestrator(rq.async_q, oq.async_q, rpcq.async_q, pools, async_chunk=False, plugin=plugin,
                                  duplex_session_config=DuplexSessionRuntimeConfig(max_sessions=2), model_config=mc)
        holder["orch"] = orch; holder["loop"] = loop; ready.set()
        await orch.run()
    loop.run_until_complete(main())
th = threading.Thread(target=boot, name="orchestrator", daemon=True); th.start(); ready.wait(10)
print("orchestrator up:", type(holder["orch"]).__name__, "stage_count", holder["orch"].stage_count)

engine = object.__new__(DuplexOmniEngine)
engine.request_queue, engine.output_queue, engine.rpc_output_queue = rq, oq, rpcq
engine._correlated_rpc_client = CorrelatedRpcClient(rq.sync_q, rpcq.sync_q)
engine.orchestrator_thread = th; engine.plugin = plugin
engine.duplex_session_config = DuplexSessionRuntimeConfig(max_sessions=2)

cfg = DuplexOmni._resolve_session_config({"modalities": ["audio", "text"], "input_audio_format": "pcm_f32le",
        "output_audio_format": "pcm16", "instructions": "Be brief.", "extra_body": {"auto_response": True}}, model="m")
sid = "duplex-" + "a" * 32
res = engine._open_session(sid, cfg)
print("open ok:", res.ok, "lease_generation", getattr(res, "lease_generation", None))
frame = np.zeros(1280, np.float32).tobytes()
t = time.time()
for i in range(7):
    engine._submit_command(sid, AppendAudio(audio=frame, format="pcm_f32le", sample_rate_hz=16000))
time.sleep(0.5)
events = []
while True:
    try: events.append(oq.sync_q.get_nowait())
    except queue.Empty: break
print("events:", [type(m.event).__name__ + ":" + str(getattr(m.event, 'type', '')) for m in events if isinstance(m, DuplexSessionEventMessage)][:40])
for r in clients[0].requests:
    d = r.model_intermediate_buffer["duplex"]
    print("stage0 req", r.request_id, "prompt_len", len(r.prompt_token_ids), "seq", d["seq"], "turn_seq", d["turn_seq"],
          "model_fields", {k: d[k] for k in ("source_input_seq",) if k in d}, "resumable", r.resumable,
          "payload_keys", sorted(d["payload"].keys()))
print("projected calls:", len(projected), "threads:", {p[0] for p in projected})
for p in projected[:6]: print("  ", p[2])
res = engine._close_session(sid)
time.sleep(0.2)
print("close ok:", res.ok, "stage0 aborted:", clients[0].aborted, "request_states left:", list(holder["orch"].request_states))
