"""Prototype: our ModelPort over DuplexOmni sessions + a plugin-side Stage-0 bus (controls in model_fields,
outputs tapped in decide_output (stage 0) and data_plane.project (stage 2)). Sync step() from an executor thread."""
import os
import asyncio, collections, concurrent.futures, queue, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
t0 = time.time()
import numpy as np
from harness import *
from vllm_omni.engine.duplex.commands import AppendAudio
from vllm_omni.engine.duplex.contracts import DuplexAppendPlan
from vllm_omni.entrypoints.duplex.audio_encoding import encode_audio
from vllm_omni_voicechat.omni.plugin import VoiceChatDuplexPlugin
print(f"imports {time.time()-t0:.1f}s")

class Tok:
    def encode(self, text, add_special_tokens=False): return [1000 + (ord(c) % 500) for c in text]
    def decode(self, ids, skip_special_tokens=True): return "".join(chr(97 + (i % 26)) for i in ids)
SPECIAL = {"nvc_text_bos_id": BOS, "nvc_text_eos_id": EOS, "nvc_text_pad_id": PAD, "nvc_function_sotc_id": 20,
           "nvc_function_eotc_id": 21, "nvc_function_eotr_id": 22, "nvc_tokenizer_ref": "fake/tok"}

class Channel:
    def __init__(self): self.controls = collections.deque(); self.tokens = queue.Queue(); self.audio = queue.Queue(); self.request_id = None
class Bus:
    def __init__(self): self.channels = {}; self.lock = threading.Lock()
    def channel(self, sid):
        with self.lock: return self.channels.setdefault(sid, Channel())
    def by_request(self, rid):
        with self.lock:
            return next((c for c in self.channels.values() if c.request_id == rid), None)

class BusPlugin(VoiceChatDuplexPlugin):
    bus = Bus()
    def plan_append(self, **kw):
        plan = super().plan_append(**kw)
        ch = self.bus.channel(kw["fence"].session_id); ch.request_id = kw["request_id"]
        controls = ch.controls.popleft() if ch.controls else {}
        plan.prompt["model_intermediate_buffer"]["duplex"]["vc_controls"] = controls   # our model_fields
        return plan
    def decide_output(self, **kw):
        decision = super().decide_output(**kw)
        if kw["stage_id"] == 0:
            ch = self.bus.by_request(kw["output"].request_id)
            if ch is not None:
                ch.tokens.put((time.monotonic(), tuple(kw["segment_token_ids"]), dict(kw["segment_output_metadata"])))
        return decision

class BusDataPlane(type(VoiceChatDuplexPlugin(encode_audio).data_plane)):
    def project(self, result, *, context=None):
        for out in result.get("data_plane_outputs", []):
            if getattr(out, "stage_id", None) == 2:
                ch = BusPlugin.bus.by_request(out.request_id)
                mm = getattr(out, "multimodal_output", None) or {}
                if ch is not None:
                    ch.audio.put((time.monotonic(), mm.get("audio")))
        return iter(())   # nothing reaches vLLM-Omni's wire layer

plugin = BusPlugin(encode_audio)
plugin.data_plane = BusDataPlane(encode_audio); plugin._nemotron.data_plane = plugin.data_plane
async def fake_rt(mc): return dict(SPECIAL), Tok()
plugin._tokenizer_runtime = fake_rt
SCRIPT = {3: BOS, 4: 1500, 5: 1501, 6: EOS}
fx = build(plugin, script=lambda rid, seq, d: SCRIPT.get(seq, PAD), audio_delay_s=0.03)

class OmniPort:
    def __init__(self, omni, loop, lag=0, timeout=5.0):
        self.omni, self.loop, self.lag, self.timeout = omni, loop, lag, timeout
        self.handle = None; self.stepped = 0
    def _run(self, coro): return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout)
    def prefill(self, instructions):
        payload = {"modalities": ["audio", "text"], "input_audio_format": "pcm_f32le", "instructions": instructions,
                   "extra_body": {"auto_response": True}}
        self.handle = self._run(self.omni.open_session(payload))
        self.ch = BusPlugin.bus.channel(self.handle.session_id)
        async def drain():
            async for ev in self.handle.events(): pass
        self.drain = asyncio.run_coroutine_threadsafe(drain(), self.loop)
        for _ in range(self.lag): self.ch.audio.put((0.0, np.zeros(1764, np.float32)))
    def step(self, pcm_f32: bytes, controls: dict):
        t = time.monotonic()
        self.ch.controls.append(controls)
        self._run(self.handle.submit(AppendAudio(audio=pcm_f32, format="pcm_f32le", sample_rate_hz=16000)))
        t_sub = time.monotonic()
        ts, toks, meta = self.ch.tokens.get(timeout=self.timeout)
        ta, audio = self.ch.audio.get(timeout=self.timeout)
        self.stepped += 1
        return dict(tok=toks[-1] if toks else None, fn=meta.get("nvc_function_token"), audio_first=float(np.asarray(audio).reshape(-1)[0]),
                    submit_ms=(t_sub - t) * 1e3, token_ms=(ts - t) * 1e3, audio_ms=(ta - t) * 1e3 if ta else 0.0)
    def abort(self):
        self._run(self.handle.close())

async def main():
    loop = asyncio.get_running_loop()
    ex = concurrent.futures.ThreadPoolExecutor(2)
    async def session(name, lag):
        port = OmniPort(fx.omni, loop, lag=lag)
        await loop.run_in_executor(ex, port.prefill, "Be brief.")
        rows = []
        for n in range(1, 9):
            r = await loop.run_in_executor(ex, port.step, np.zeros(1280, np.float32).tobytes(), {"eou_now": n == 2})
            rows.append(r)
        await loop.run_in_executor(ex, port.abort)
        print(name, "lag", lag, "session", port.handle.session_id[:14], "close_reason", port.handle.close_reason)
        for n, r in enumerate(rows, 1):
            print(f"  pos{n}: tok={r['tok']} fn={r['fn']} audio_of_seq={round(r['audio_first']*1000)} submit={r['submit_ms']:.1f}ms token={r['token_ms']:.1f}ms audio={r['audio_ms']:.1f}ms")
    await asyncio.gather(session("A", 0), session("B", 1))
    ctl = [r.model_intermediate_buffer["duplex"].get("vc_controls") for r in fx.clients[0].requests][:4]
    print("stage0 requests:", len(fx.clients[0].requests), "first vc_controls:", ctl)
    print("aborted stage0 ids:", len(fx.clients[0].aborted), "request_states left:", list(fx.orch.request_states))
asyncio.run(main())
