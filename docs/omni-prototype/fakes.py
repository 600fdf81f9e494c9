"""Fake stage engines for DuplexOrchestrator on CPU (research for issue 6)."""
from __future__ import annotations
import asyncio, threading, time
from types import SimpleNamespace
import numpy as np
import janus
from vllm.sampling_params import SamplingParams

PAD, BOS, EOS = 12, 1, 2

class FakeOutputProcessor:
    """Stands in for vLLM's OutputProcessor: raw EngineCoreOutput-likes -> RequestOutput-likes."""
    def __init__(self):
        self.added = []
    def add_request(self, request, prompt, parent_req, request_index, queue):
        self.added.append(request.request_id)
    def remove_request(self, rid):
        pass
    def process_outputs(self, outputs, timestamp, iteration_stats):
        ros = []
        for eco in outputs:
            completion = SimpleNamespace(token_ids=list(eco.new_token_ids), cumulative_token_ids=None,
                                         finish_reason=None, multimodal_output=eco.multimodal_output, text="")
            ros.append(SimpleNamespace(request_id=eco.request_id, finished=False, outputs=[completion],
                                       multimodal_output=eco.multimodal_output, error=None, prompt_token_ids=[]))
        return SimpleNamespace(request_outputs=ros, reqs_to_abort=[])
    def update_scheduler_stats(self, s):
        pass

def eco(rid, tokens=(), mm=None, seg=True):
    return SimpleNamespace(request_id=rid, new_token_ids=list(tokens), is_segment_finished=seg, finish_reason=None,
                           kv_transfer_params=None, multimodal_output=mm or {}, stop_reason=None,
                           new_prompt_len_snapshot=None)

def raw(*ecos):
    return SimpleNamespace(outputs=list(ecos), scheduler_stats=None, finished_requests=None, timestamp=time.time())

class FakeLLMClient:
    stage_type = "llm"
    custom_process_input_func = None
    final_output_type = "audio"
    def __init__(self, stage_id, *, final_output, params):
        self.stage_id = stage_id
        self.final_output = final_output
        self.default_sampling_params = params
        self.requests = []
        self.aborted = []
        self._q = None
        self.on_add = None  # callable(request) scheduled by the harness
    def q(self):
        if self._q is None:
            self._q = asyncio.Queue()
        return self._q
    async def add_request_async(self, request, **kw):
        self.requests.append(request)
        if self.on_add is not None:
            self.on_add(request)
    async def get_output_async(self):
        return await self.q().get()
    async def abort_requests_async(self, ids):
        self.aborted.extend(ids)
    async def collective_rpc_async(self, *a, **k):
        return None
    def emit(self, raw_outputs):
        self.q().put_nowait(raw_outputs)

def stage_params():
    s0 = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, seed=0)
    s1 = SamplingParams(temperature=0.0, max_tokens=16383, stop_token_ids=[1], detokenize=False, seed=0)
    s2 = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False, seed=0)
    return s0, s1, s2
