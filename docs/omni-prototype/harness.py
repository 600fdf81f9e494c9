"""Fake engine: real DuplexOrchestrator on its own thread + real DuplexOmniEngine/DuplexOmni control surfaces
(built without __init__), fake stage clients. Scripted Stage-0 tokens per seq; Stage-2 audio after a delay."""
import os
import asyncio, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import numpy as np, janus
from types import SimpleNamespace
from fakes import *
from vllm_omni.config.stage_config import DuplexSessionRuntimeConfig
from vllm_omni.engine.stage_pool import StagePool
from vllm_omni.engine.duplex_orchestrator import DuplexOrchestrator
from vllm_omni.engine.duplex_omni_engine import DuplexOmniEngine
from vllm_omni.engine.rpc_result_router import CorrelatedRpcClient
from vllm_omni.entrypoints.duplex_omni import DuplexOmni

class FakeOP(FakeOutputProcessor):
    def abort_requests(self, ids, internal=False):
        return list(ids)

def build(plugin, *, max_sessions=2, script=None, audio_delay_s=0.03, stage0_delay_s=0.002):
    params = stage_params()
    clients = [FakeLLMClient(0, final_output=False, params=params[0]), FakeLLMClient(1, final_output=False, params=params[1]),
               FakeLLMClient(2, final_output=True, params=params[2])]
    mc = SimpleNamespace(max_model_len=8192, hf_config=SimpleNamespace(stt_cfg={}))
    pools = [StagePool(i, [c], output_processor=FakeOP(), stage_vllm_config=SimpleNamespace(model_config=mc)) for i, c in enumerate(clients)]
    script = script or (lambda rid, seq, duplex: PAD)
    def on_stage0(request):
        d = request.model_intermediate_buffer["duplex"]; rid = request.request_id; seq = d["seq"]
        tok = script(rid, seq, d)
        loop = asyncio.get_running_loop()
        loop.call_later(stage0_delay_s, lambda: clients[0].emit(raw(eco(rid, [tok], {"nvc_function_token": [PAD]}))))
        loop.call_later(audio_delay_s, lambda: clients[2].emit(raw(eco(rid, [], {"audio": np.full(1764, seq / 1000, np.float32), "sr": 22050}))))
    clients[0].on_add = on_stage0
    rcfg = DuplexSessionRuntimeConfig(max_sessions=max_sessions)
    rq, oq, rpcq = janus.Queue(maxsize=1024), janus.Queue(), janus.Queue()
    ready = threading.Event(); holder = {}
    def boot():
        loop = asyncio.new_event_loop(); asyncio.set_event_loop(loop)
        async def main():
            orch = DuplexOrchestrator(rq.async_q, oq.async_q, rpcq.async_q, pools, async_chunk=False, plugin=plugin,
                                      duplex_session_config=rcfg, model_config=mc)
            holder.update(orch=orch, loop=loop); ready.set()
            await orch.run()
        loop.run_until_complete(main())
    th = threading.Thread(target=boot, name="orchestrator", daemon=True); th.start(); assert ready.wait(10)
    engine = object.__new__(DuplexOmniEngine)
    engine.request_queue, engine.output_queue, engine.rpc_output_queue = rq, oq, rpcq
    engine._correlated_rpc_client = CorrelatedRpcClient(rq.sync_q, rpcq.sync_q)
    engine.orchestrator_thread = th; engine.plugin = plugin; engine.duplex_session_config = rcfg
    engine._output_drain_executor = None
    omni = object.__new__(DuplexOmni)
    omni.engine = engine; omni.model = "m"; omni._handles = {}; omni.final_output_task = None
    omni._resume_compensations = set()
    return SimpleNamespace(omni=omni, engine=engine, clients=clients, orch=holder["orch"], orch_loop=holder["loop"])
