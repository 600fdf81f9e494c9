"""vLLM-Omni 0.30.0's real duplex engine stack on CPU over fake stage engines (tests only; needs vllm_omni).

The real ``DuplexOrchestrator`` (with its ``DuplexSessionManager``, session runners and our plugin) runs on its own
thread and event loop (``async_chunk=True``, as deployed), over real ``StagePool``s with vLLM-Omni's real output
processors, whose stage clients are fakes: Stage 0 answers every append with a scripted token, Stage 2 answers
with an 80 ms audio packet a little later, both as the engine core's ``OmniEngineCoreOutputs``.
``DuplexOmniEngine`` / ``DuplexOmni`` are built around it without their constructors (those start real stage
processes). Building this fixture is itself the pin on the private shapes it relies on (docs/omni-integration.md
§3, §5): the ``OrchestratorBase`` and ``StagePool`` constructors, the stage-client protocol, the engine-core output
types and the ``DuplexOmniEngine``/``DuplexOmni`` attribute names.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import janus
import numpy as np
import torch
from vllm.sampling_params import SamplingParams
from vllm_omni.config.stage_config import DuplexSessionRuntimeConfig
from vllm_omni.engine import OmniEngineCoreOutput, OmniEngineCoreOutputs
from vllm_omni.engine.duplex_omni_engine import DuplexOmniEngine
from vllm_omni.engine.duplex_orchestrator import DuplexOrchestrator
from vllm_omni.engine.rpc_result_router import CorrelatedRpcClient
from vllm_omni.engine.stage_pool import StagePool
from vllm_omni.entrypoints.duplex_omni import DuplexOmni

PAD, BOS, EOS = 12, 1, 2
SPECIAL_IDS = {"nvc_text_bos_id": BOS, "nvc_text_eos_id": EOS, "nvc_text_pad_id": PAD, "nvc_function_sotc_id": 20,
               "nvc_function_eotc_id": 21, "nvc_function_eotr_id": 22, "nvc_tokenizer_ref": "fake/tokenizer"}
# A Stage-0 append request -> (token id, Stage-0 output metadata, this position's Stage-2 audio as float32)
Respond = Callable[[Any], tuple[int, dict, np.ndarray]]


def constant_response(request) -> tuple[int, dict, np.ndarray]:
    seq = request.model_intermediate_buffer["duplex"]["seq"]
    return PAD, {"nvc_function_token": [PAD]}, np.full(1764, seq / 1000, np.float32)


class FakeTokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1000 + (ord(c) % 500) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


def output_processor(stage_id: int):
    """The stage's output processor as vLLM-Omni builds it (``stage_init_utils.build_llm_stage_output_processor``):
    the real ``MultimodalOutputProcessor`` with the pipeline's engine output type. No tokenizer: the fake
    checkpoint has none (the real Stage 0 detokenizes with the checkpoint's; our plugin reads token ids)."""
    from vllm_omni.outputs.output_processor import MultimodalOutputProcessor

    from vllm_omni_voicechat.omni.pipeline import VOICECHAT_PIPELINE

    return MultimodalOutputProcessor(tokenizer=None, log_stats=False,
                                     engine_core_output_type=VOICECHAT_PIPELINE.stages[stage_id].engine_output_type)


def engine_core_output(request_id: str, tokens=(), multimodal: dict | None = None) -> OmniEngineCoreOutput:
    return OmniEngineCoreOutput(request_id=request_id, new_token_ids=list(tokens), is_segment_finished=True,
                                multimodal_output=multimodal or None)


def step_outputs(*outputs) -> OmniEngineCoreOutputs:
    return OmniEngineCoreOutputs(outputs=list(outputs), timestamp=time.time())


def as_tensors(metadata: dict) -> dict:
    """A Stage-0 multimodal dict as the worker ships it (tensors only: ``vc_step`` as its uint8 wire bytes)."""
    from vllm_omni_voicechat.omni.envelope import EVIDENCE_KEY, evidence_to_wire

    out = {}
    for key, value in metadata.items():
        if key == EVIDENCE_KEY and isinstance(value, dict):
            value = torch.frombuffer(bytearray(evidence_to_wire(value)), dtype=torch.uint8)
        out[key] = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    return out


class FakeStageClient:
    """One stage's engine client: records requests and aborts, emits what the harness schedules."""

    stage_type = "llm"
    custom_process_input_func = None
    final_output_type = "audio"

    def __init__(self, stage_id: int, *, final_output: bool, params: SamplingParams) -> None:
        self.stage_id = stage_id
        self.final_output = final_output
        self.default_sampling_params = params
        self.requests: list[Any] = []
        self.aborted: list[str] = []
        self.on_add: Callable[[Any], None] | None = None
        self._queue: asyncio.Queue | None = None

    def _q(self) -> asyncio.Queue:
        if self._queue is None:
            self._queue = asyncio.Queue()
        return self._queue

    async def add_request_async(self, request, **kw) -> None:
        self.requests.append(request)
        if self.on_add is not None:
            self.on_add(request)

    async def get_output_async(self):
        return await self._q().get()

    async def abort_requests_async(self, request_ids) -> None:
        self.aborted.extend(request_ids)

    async def collective_rpc_async(self, *args, **kw):
        return None

    def emit(self, outputs) -> None:
        self._q().put_nowait(outputs)


@dataclass
class FakeEngine:
    omni: DuplexOmni
    engine: DuplexOmniEngine
    orchestrator: DuplexOrchestrator
    loop: asyncio.AbstractEventLoop
    clients: list[FakeStageClient]
    thread: threading.Thread
    stage2_packets: list[tuple[str, int]] = field(default_factory=list)


def build_fake_engine(plugin, *, max_sessions: int = 2, respond: Respond = constant_response,
                      audio_delay_s: float = 0.02) -> FakeEngine:
    params = (SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, seed=0),
              SamplingParams(temperature=0.0, max_tokens=16383, stop_token_ids=[1], detokenize=False, seed=0),
              SamplingParams(temperature=0.0, max_tokens=1, detokenize=False, seed=0))
    clients = [FakeStageClient(i, final_output=i == 2, params=params[i]) for i in range(3)]
    model_config = SimpleNamespace(max_model_len=8192, hf_config=SimpleNamespace(stt_cfg={}))
    pools = [StagePool(i, [c], output_processor=output_processor(i),
                       stage_vllm_config=SimpleNamespace(model_config=model_config)) for i, c in enumerate(clients)]
    fake = SimpleNamespace(stage2_packets=[])

    def on_stage0(request) -> None:
        rid, seq = request.request_id, request.model_intermediate_buffer["duplex"]["seq"]
        token, metadata, audio = respond(request)
        loop = asyncio.get_running_loop()
        clients[0].emit(step_outputs(engine_core_output(rid, [token], as_tensors(metadata))))
        # what the code2wav model returns (``NemotronVoiceChatCode2Wav``: ``model_outputs`` + an int32 ``sr``)
        packet = {"model_outputs": torch.from_numpy(np.array(audio, np.float32)),
                  "sr": torch.tensor(22050, dtype=torch.int32)}

        def stage2() -> None:
            fake.stage2_packets.append((rid, seq))
            clients[2].emit(step_outputs(engine_core_output(rid, [], packet)))

        loop.call_later(audio_delay_s, stage2)

    clients[0].on_add = on_stage0
    runtime = DuplexSessionRuntimeConfig(max_sessions=max_sessions)
    request_q, output_q, rpc_q = janus.Queue(maxsize=1024), janus.Queue(), janus.Queue()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def boot() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)

        async def main() -> None:
            orchestrator = DuplexOrchestrator(request_q.async_q, output_q.async_q, rpc_q.async_q, pools,
                                              async_chunk=True, plugin=plugin, duplex_session_config=runtime,
                                              model_config=model_config)
            holder.update(orchestrator=orchestrator, loop=loop)
            ready.set()
            await orchestrator.run()

        loop.run_until_complete(main())

    thread = threading.Thread(target=boot, name="fake-orchestrator", daemon=True)
    thread.start()
    if not ready.wait(30):
        raise RuntimeError("the orchestrator did not start")
    engine = object.__new__(DuplexOmniEngine)
    engine.request_queue, engine.output_queue, engine.rpc_output_queue = request_q, output_q, rpc_q
    engine._correlated_rpc_client = CorrelatedRpcClient(request_q.sync_q, rpc_q.sync_q)
    engine.orchestrator_thread = thread
    engine.plugin = plugin
    engine.duplex_session_config = runtime
    engine._output_drain_executor = None
    omni = object.__new__(DuplexOmni)
    omni.engine, omni.model, omni._handles, omni.final_output_task = engine, "m", {}, None
    omni._resume_compensations = set()
    built = FakeEngine(omni, engine, holder["orchestrator"], holder["loop"], clients, thread)
    built.stage2_packets = fake.stage2_packets
    return built


def simulator_respond(prompt_for: Callable[[Any], Any] | None = None) -> Respond:
    """A Stage 0 played by our simulator, one per Stage-0 request: it reads the position's ``vc`` controls from
    the append envelope and answers with its token, the ``vc_step`` evidence our thinker will return, and the
    position's audio (what the real thinker + talker + codec would produce)."""
    import base64

    from vllm_omni_voicechat.model.port import PositionInput, SessionPrompt
    from vllm_omni_voicechat.omni.envelope import EVIDENCE_KEY, decode_controls, encode_evidence
    from vllm_omni_voicechat.sim.model import SimulatorModel

    sims: dict[str, SimulatorModel] = {}

    def respond(request) -> tuple[int, dict, np.ndarray]:
        duplex = request.model_intermediate_buffer["duplex"]
        sim = sims.get(request.request_id)
        if sim is None:
            sim = sims[request.request_id] = SimulatorModel()
            sim.prefill(prompt_for(duplex) if prompt_for else SessionPrompt("Be brief."))
        vc = duplex.get("vc") or {}
        payload = duplex["payload"]
        f32 = np.frombuffer(base64.b64decode(payload["audio"]) if isinstance(payload["audio"], str)
                            else payload["audio"], "<f4")
        pcm16 = np.clip(np.rint(f32 * 32768.0), -32768, 32767).astype("<i2").tobytes()
        result = sim.step(PositionInput(pcm16, decode_controls(vc), synthetic=bool(vc.get("synthetic"))))
        token = result.agent.token_id if result.agent.token_id is not None else PAD
        audio = np.frombuffer(result.audio, "<i2").astype(np.float32) / 32768.0
        return token, {"nvc_function_token": [PAD], EVIDENCE_KEY: encode_evidence(result)}, audio

    respond.sims = sims  # type: ignore[attr-defined]
    return respond


class ApiLoop:
    """The API server's event loop on a thread (where ``DuplexOmni`` session handles live)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fake-api-loop", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def wait_until(predicate: Callable[[], bool], timeout_s: float = 30.0, state: Callable[[], Any] = lambda: None) -> None:
    """Wait for a condition the orchestrator thread establishes (its state has no event to await)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in time; state: {state()}")
        time.sleep(0.005)  # ok: polls another thread's state, bounded by the deadline


def voicechat_plugin():
    """Our plugin as vLLM-Omni would load it, with the fake checkpoint tokenizer (no weights here)."""
    from vllm_omni.entrypoints.duplex.audio_encoding import encode_audio

    from vllm_omni_voicechat.omni.plugin import VoiceChatDuplexPlugin

    plugin = VoiceChatDuplexPlugin(encode_audio)

    async def tokenizer_runtime(model_config):
        return dict(SPECIAL_IDS), FakeTokenizer()

    plugin._tokenizer_runtime = tokenizer_runtime  # the checkpoint tokenizer seam
    return plugin
