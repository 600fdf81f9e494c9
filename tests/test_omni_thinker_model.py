"""Contract: our registered thinker class (tiny random modules of the real structure, no checkpoint) driven through
vLLM-Omni's real orchestrator, our real plugin and ``OmniStage0Port`` by our session core.

The thinker's hooks run exactly as vLLM-Omni's AR runner calls them (``preprocess`` -> backbone stand-in ->
``make_omni_output`` -> ``compute_logits`` -> ``sample`` -> ``postprocess``), its multimodal output crosses the
worker's tensor-only wire filter, and what the runtime receives is checked against the simulator's run of the same
client turn. The "model" is scripted where a checkpoint would decide (the text/function heads' greedy choices);
perception is a stand-in; the RNNT, the control application and every seam are the real code.
"""

from __future__ import annotations

import base64
import dataclasses
from collections import deque

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm_omni")

import numpy as np
from torch import nn

from vllm_omni_voicechat.model.port import AgentControl, BoundaryPhase, PositionControls
from vllm_omni_voicechat.omni.envelope import EVIDENCE_KEY, decode_step, encode_controls

PAD, BOS, EOS, SOTC, EOTC, EOTR = 12, 1, 2, 20, 21, 22
HID, VOCAB, E = 16, 2048, 4
WORDS = {1000: "Hi", 1001: " there", 1002: ".", 1003: "<TOOLCALL>", 1004: '[{"name":"get_time",',
         1005: '"arguments":{}}]', 1006: "</TOOLCALL>"}
REPLY = (1000, 1001, 1002)
CALL = (SOTC, 1003, 1004, 1005, 1006, EOTC)
PIECES = ["<unk>", "\u2581he", "llo"]
NAMES = {PAD: "<SPECIAL_12>", BOS: "<s>", EOS: "</s>", SOTC: "<SPECIAL_20>", EOTC: "<SPECIAL_21>", EOTR: "<SPECIAL_22>"}


class Tokenizer:
    """The LLM tokenizer fake (the engine loads the checkpoint's)."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(NAMES.get(i) or WORDS.get(i) or f"<{i}>" for i in ids)

    def encode(self, text, add_special_tokens=False):
        return [900 + ord(c) % 100 for c in text]


class ScriptedHeads(nn.Module):
    """Greedy choices a checkpoint would make: PAD while listening, then the reply after a BOS, then EOS."""

    def __init__(self, *, calls_tool: bool = False) -> None:
        super().__init__()
        self.queue: deque[int] = deque()
        self.speaking = False
        self.calls_tool = calls_tool  # after BOS: the call on the function channel, the reply only after EOTR
        self.call: deque[int] = deque()
        self.result_in = False
        self.forced_function: int | None = None

    @property
    def function_next(self) -> int:
        if self.forced_function is not None:
            return self.forced_function
        return self.call[0] if self.speaking and self.call else PAD

    @function_next.setter
    def function_next(self, token: int) -> None:
        self.forced_function = token

    def text_next(self) -> int:
        if not self.speaking or (self.calls_tool and not self.result_in):
            return PAD
        return self.queue[0] if self.queue else EOS

    def observe_function(self, token: int) -> None:
        if self.call and token == self.call[0]:
            self.call.popleft()
        elif token == EOTR:
            self.result_in = True

    def observe(self, token: int) -> None:
        if token == BOS:
            self.speaking, self.queue = True, deque(REPLY)
            self.call = deque(CALL if self.calls_tool else ())
        elif token == EOS:
            self.speaking = False
        elif self.queue and token == self.queue[0]:
            self.queue.popleft()

    @staticmethod
    def one_hot(rows: int, token: int) -> torch.Tensor:
        out = torch.zeros(rows, VOCAB)
        out[:, token] = 1.0
        return out


def tiny_rnnt():
    """Emits the piece "▁he" on frames with speech energy, blank on silence."""
    from vllm_omni_voicechat.omni.thinker.rnnt import RnntModules

    torch.manual_seed(0)
    m = RnntModules(vocab_size=len(PIECES), pred_hidden=6, num_layers=2, enc_hidden=E, joint_hidden=5).eval()
    with torch.no_grad():
        for p in (m.enc.weight, m.enc.bias, m.pred.weight, m.pred.bias, m.out.weight, m.out.bias):
            p.zero_()
        m.enc.weight[0, 0], m.enc.bias[0] = 100.0, -1.0
        m.out.weight[1, 0], m.out.bias[len(PIECES)] = 10.0, 1.0
    return m


def tiny_thinker(heads: ScriptedHeads):
    from vllm_omni.model_executor.models.nemotron_voicechat.duplex.input import (
        decode_pcm_f32le,
    )

    from vllm_omni_voicechat.omni.thinker.model import VoiceChatRealtimeThinker
    from vllm_omni_voicechat.omni.thinker.rnnt import VocabFile

    class LanguageModel(nn.Module):
        def compute_logits(self, hidden):
            return ScriptedHeads.one_hot(hidden.shape[0], heads.text_next())

    class FunctionHead(nn.Module):
        def forward(self, hidden):
            return ScriptedHeads.one_hot(hidden.shape[0], heads.function_next)

    class TinyThinker(VoiceChatRealtimeThinker):
        def __init__(self) -> None:  # the engine's __init__ builds the 9 B model; the state it sets, tiny
            nn.Module.__init__(self)
            torch.manual_seed(1)
            self._hidden, self._vocab, self._dtype = HID, VOCAB, torch.float32
            self.embed_tokens = nn.Embedding(VOCAB, HID)
            self.function_head = FunctionHead()
            self.language_model = LanguageModel()
            self._w_text, self._w_audio, self._w_func, self._use_function_head = 1.0, 1.0, 2.0, True
            self._sessions, self._duplex_sampling_rows, self._duplex_previous_text_tokens = {}, {}, {}
            self.stt_cfg = {}
            self.projection = nn.Linear(E, HID)
            self._init_voicechat(rnnt=tiny_rnnt(), rnnt_vocabulary=VocabFile(PIECES), llm_tokenizer=Tokenizer(),
                                 rnnt_max_symbols=1)

        def _duplex_stable_frame(self, session, duplex, device):
            # Perception stand-in: the encoder frame is the frame's RMS (the real one captures the Conformer's).
            if duplex["source_input_seq"] == session.get("last_input_seq"):
                return session["duplex_frame"]
            pcm = np.frombuffer(decode_pcm_f32le(duplex["payload"], exact_frame=True), "<f4")
            encoder = torch.tensor([float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))), 1.0, 0.0, 0.0])
            session["vc_encoder_frame"] = encoder
            session["duplex_frame"] = self.projection(encoder).reshape(1, HID).detach()
            session["last_input_seq"] = duplex["source_input_seq"]
            return session["duplex_frame"]

    return TinyThinker()


class ThinkerStage0:
    """Plays Stage 0 for the fake engine with the thinker, hook by hook as vLLM-Omni's AR runner does."""

    def __init__(self) -> None:
        from vllm_omni.worker.gpu_ar_model_runner import _ensure_tensor_values

        self.heads = ScriptedHeads()
        self.model = tiny_thinker(self.heads)
        self.backbone = nn.Linear(HID, HID)
        self.computed: dict[str, int] = {}
        self.wire = _ensure_tensor_values
        self.requests: list = []

    def __call__(self, request):
        from vllm_omni.model_executor.duplex_sampling import DuplexSamplingRow

        rid, mib = request.request_id, request.model_intermediate_buffer
        self.requests.append(request)
        ids = torch.tensor(list(request.prompt_token_ids))
        offset = self.computed.get(rid, 0)
        self.computed[rid] = offset + len(ids)
        info = {**mib, "_omni_num_computed_tokens": offset}
        m = self.model
        with torch.no_grad():
            ids, embeds, _ = m.preprocess(ids, None, **info)
            hidden = torch.tanh(self.backbone(embeds))
            out = m.make_omni_output(hidden, model_intermediate_buffer=[info])
            logits = m.compute_logits(hidden[-1:])
            m.prepare_duplex_sampling(logits, None, (DuplexSamplingRow(0, rid, None, None, None, 1),))
            token = int(m.sample(logits, None).sampled_token_ids[0, 0])
            update = m.postprocess(hidden, request_id=rid)
        self.heads.observe(token)
        req = m._vc.get(rid)
        if req is not None and req.function is not None:
            self.heads.observe_function(req.function)
        self.last_update = update
        payload = self.wire({k: v[0] if isinstance(v, list) else v for k, v in out.multimodal_outputs.items()})
        return token, payload, np.zeros(1764, np.float32)


@pytest.fixture(scope="module")
def engines():
    from .omni_fake_engine import (
        ApiLoop,
        build_fake_engine,
        simulator_respond,
        voicechat_plugin,
    )

    api = ApiLoop()
    built = {}
    for name, respond in (("thinker", ThinkerStage0()), ("sim", simulator_respond())):
        plugin = voicechat_plugin()
        engine = build_fake_engine(plugin, max_sessions=2, respond=respond, audio_delay_s=0.002)
        engine.plugin, engine.respond, engine.api = plugin, respond, api
        built[name] = engine
    yield built
    api.close()


class RecordingPort:
    """``OmniStage0Port`` keeping the StepResults the runtime received."""

    def __init__(self, engine) -> None:
        from vllm_omni_voicechat.omni.port import OmniStage0Port

        self.port = OmniStage0Port(engine.omni, engine.api.loop, engine.plugin.bus)
        self.results: list = []
        self.controls: list = []

    def prefill(self, prompt):
        self.port.prefill(prompt)

    def step(self, position):
        self.controls.append(position.controls)
        result = self.port.step(position)
        self.results.append(result)
        return result

    def abort(self):
        self.port.abort()


def client_turn(engine):
    from vllm_omni_voicechat.model.port import SessionPrompt
    from vllm_omni_voicechat.session.commands import (
        AppendAudio,
        CommitTurn,
        Configure,
        StartTurn,
    )
    from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
    from vllm_omni_voicechat.shell.sync import SyncDriver
    from vllm_omni_voicechat.audio.speech import render_speech

    port = RecordingPort(engine)
    d = SyncDriver(SessionCore(SessionConfig(session_id="S", settlement_blank_frames=3)), port)
    d.send(Configure(SessionPrompt("Be brief.")))
    d.send(StartTurn(1, "s1"))
    d.send(AppendAudio(render_speech("hello")))
    d.send(CommitTurn(1, "c1"))
    d.run()
    port.abort()
    return d, port


def test_a_client_turn_on_the_thinker_reaches_the_runtime_exactly_as_on_the_simulator(engines):
    from vllm_omni_voicechat.session import events as ev

    d, port = client_turn(engines["thinker"])
    sim_d, sim_port = client_turn(engines["sim"])
    # Same controls from the runtime (settlement to the fence, the fused EOU) on the same input ...
    fence = next(i for i, r in enumerate(port.results) if r.eou_consumed)
    assert fence == next(i for i, r in enumerate(sim_port.results) if r.eou_consumed)
    assert port.controls[: fence + 1] == sim_port.controls[: fence + 1]
    assert port.controls[fence].eou_at_fence == 3 and all(c.pre_eou for c in port.controls[fence - 2 : fence + 1])
    assert [(r.rnnt.text_delta, r.rnnt.blank_count) for r in port.results[: fence + 1]] == [
        ("he", 0), (" he", 0), ("", 1), ("", 2), ("", 3)]  # the RNNT heard both speech frames, then the fence
    for results in (port.results, sim_port.results):  # ... and the same fused EOU/BOS position contract
        r = results[fence]
        assert (r.agent.control, r.boundary.started, r.fence_blank_count, r.rnnt.blank_count) == (
            AgentControl.AGENT_BOS, True, 3, 3)
    # The runtime's event sequence differs only in what was said.
    def kinds(events):
        skip = (ev.PositionMetrics, ev.AudioDelta, ev.TextDelta, ev.TranscriptDelta)
        return [type(e).__name__ for e in events if not isinstance(e, skip)]

    assert kinds(d.events) == kinds(sim_d.events)
    assert [e.text for e in d.events if isinstance(e, ev.TextDone)] == ["Hi there."]
    done = [e for e in d.events if isinstance(e, ev.ResponseDone)]
    assert [(e.status, e.reason) for e in done] == [("completed", "post_eos_audio_silence")]
    transcript = [e.transcript for e in d.events if isinstance(e, ev.TranscriptCompleted)]
    assert len(transcript) == 1 and set(transcript[0].split()) == {"he"}
    # Positions after BOS: the reply, the model's EOS, then the tail ends the response on the acoustic terminal.
    after = port.results[fence + 1 :]
    assert [r.agent.control for r in after[:4]] == [AgentControl.TEXT] * 3 + [AgentControl.AGENT_EOS]
    assert [(r.boundary.phase, r.boundary.ended) for r in after[4:7]] == [
        (BoundaryPhase.TAIL_DRAINING, False), (BoundaryPhase.TAIL_DRAINING, False), (BoundaryPhase.COMPLETE, True)]


def test_evidence_crosses_the_worker_wire_filter_and_the_envelope_controls_reach_the_thinker(engines):
    stage0 = engines["thinker"].respond
    request = stage0.requests[-1]
    vc = request.model_intermediate_buffer["duplex"]["vc"]
    assert set(vc) >= {"v", "position", "eou_now", "eou_at_fence", "cancel_eou", "agent_eos", "force_text_pad",
                       "pre_eou", "tool_result_token_ids", "tool_result_tokens"}
    token, payload, _ = stage0(_next_request(request))
    assert payload[EVIDENCE_KEY].dtype == torch.uint8  # a dict would have been dropped by the worker
    result = decode_step(payload[EVIDENCE_KEY], b"", 0.0)
    assert result.agent.token_id == token and result.rnnt.blank
    assert int(stage0.last_update["nvc_prev_function_token"].reshape(-1)[0]) == PAD


def _next_request(request, **controls):
    """The next append on the same Stage-0 request, as the plugin would plan it."""
    duplex = dict(request.model_intermediate_buffer["duplex"])
    seq = int(duplex["source_input_seq"]) + 1
    vc = encode_controls(PositionControls(**controls), position=duplex["vc"]["position"] + 1, synthetic=True,
                         token_ids=lambda tokens: [])
    duplex.update(seq=seq, source_input_seq=seq, vc=vc,
                  payload={**duplex["payload"], "audio": base64.b64encode(bytes(1280 * 4)).decode()})
    mib = {**request.model_intermediate_buffer, "duplex": duplex}
    return dataclasses.replace(request, prompt_token_ids=[PAD], model_intermediate_buffer=mib) \
        if dataclasses.is_dataclass(request) else _Req(request.request_id, [PAD], mib)


@dataclasses.dataclass
class _Req:
    request_id: str
    prompt_token_ids: list
    model_intermediate_buffer: dict


def test_tool_call_and_result_injection_through_the_hooks_then_state_is_dropped_with_the_request(engines):
    stage0 = ThinkerStage0()  # a fresh thinker on a copy of a real first append
    first = engines["thinker"].respond.requests[0]
    rid = "duplex-s.test.e.0.r.stage0"
    mib = {**first.model_intermediate_buffer, "request_id": rid}
    duplex = dict(mib["duplex"])
    duplex["vc"] = encode_controls(PositionControls(eou_now=True), position=0, synthetic=False,
                                   token_ids=lambda t: [])
    req = _Req(rid, list(first.prompt_token_ids), {**mib, "duplex": duplex})
    token, payload, _ = stage0(req)
    assert token == BOS and decode_step(payload[EVIDENCE_KEY], b"", 0.0).eou_consumed
    stage0.heads.queue.clear()  # the model calls a tool instead of answering
    results = []
    for fn in (SOTC, 1000, EOTC):
        stage0.heads.function_next = fn
        req = _next_request(req)
        token, payload, _ = stage0(req)
        results.append(decode_step(payload[EVIDENCE_KEY], b"", 0.0))
        # the effective function id feeds the next position's fusion
        assert int(stage0.last_update["nvc_prev_function_token"].reshape(-1)[0]) == fn
        assert stage0.model._sessions[rid]["func_token"] == fn
    assert [r.function.token for r in results] == ["<SPECIAL_20>", "Hi", "<SPECIAL_21>"]
    assert results[-1].function.awaiting_result and results[-1].tool_call is None  # "Hi" is not a call payload
    stage0.heads.function_next = PAD
    req = _next_request(req, tool_result_tokens=("ok",))  # strings only: the thinker tokenizes them
    token, payload, _ = stage0(req)
    r = decode_step(payload[EVIDENCE_KEY], b"", 0.0)
    assert token == PAD and r.function.injecting and r.function.forced_tokens == 1
    assert r.function.token == "<" + str(Tokenizer().encode("ok")[0]) + ">"
    stage0.model.on_requests_finished({rid})  # abort / epoch end
    assert rid not in stage0.model._vc and rid not in stage0.model._sessions


def test_typed_input_reaches_the_thinker_unpaced_as_ordinary_model_positions(engines):
    # Issue 7 item 4: synthesized PCM is forwarded as model positions (the runtime's typed path, commit 3c635a7
    # made the engine's synthesizer Pocket TTS); the thinker hears it through the same RNNT/fence/EOU path.
    from vllm_omni_voicechat.model.port import SessionPrompt
    from vllm_omni_voicechat.session import events as ev
    from vllm_omni_voicechat.session.commands import Configure, RequestTypedInput
    from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
    from vllm_omni_voicechat.shell.sync import SyncDriver
    from vllm_omni_voicechat.synth.simulated import SimulatorSynthesizer

    port = RecordingPort(engines["thinker"])
    d = SyncDriver(SessionCore(SessionConfig(session_id="T", settlement_blank_frames=3)), port,
                   synthesizer=SimulatorSynthesizer())
    d.send(Configure(SessionPrompt("Be brief.")))
    d.send(RequestTypedInput("j1", "hello"))
    d.run()
    port.abort()
    kinds = [e.kind for e in d.events if isinstance(e, ev.PositionMetrics) and e.frame is not None]
    typed = kinds.count("typed")
    assert typed >= 2 and kinds[:typed] == ["typed"] * typed and "settlement" in kinds
    assert [r.rnnt.text_delta for r in port.results[:2]] == ["he", " he"]
    done = [e for e in d.events if isinstance(e, ev.TranscriptCompleted)]
    assert [(e.source, e.job_id) for e in done] == [("typed", "j1")] and set(done[0].transcript.split()) == {"he"}
    assert [e.text for e in d.events if isinstance(e, ev.TextDone)] == ["Hi there."]
    assert [e.status for e in d.events if isinstance(e, ev.ResponseDone)] == ["completed"]


def test_a_tool_call_through_the_runtime_is_published_its_result_injected_and_then_answered():
    from vllm_omni_voicechat.model.port import SessionPrompt, ToolSpec
    from vllm_omni_voicechat.session import events as ev
    from vllm_omni_voicechat.session.commands import (
        AppendAudio,
        CommitTurn,
        Configure,
        StartTurn,
        SubmitFunctionOutput,
    )
    from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
    from vllm_omni_voicechat.shell.sync import SyncDriver
    from vllm_omni_voicechat.audio.speech import render_speech

    from .omni_fake_engine import ApiLoop, build_fake_engine, voicechat_plugin

    stage0 = ThinkerStage0()
    stage0.heads.calls_tool = True
    api, plugin = ApiLoop(), voicechat_plugin()
    engine = build_fake_engine(plugin, max_sessions=1, respond=stage0, audio_delay_s=0.002)
    engine.plugin, engine.api = plugin, api
    try:
        port = RecordingPort(engine)
        d = SyncDriver(SessionCore(SessionConfig(session_id="F", settlement_blank_frames=3)), port)
        d.send(Configure(SessionPrompt("Be brief.", (ToolSpec("get_time", "The time."),))))
        d.send(StartTurn(1, "s1"))
        d.send(AppendAudio(render_speech("hello")))
        d.send(CommitTurn(1, "c1"))
        answered = False
        for _ in range(400):
            calls = [e for e in d.events if isinstance(e, ev.FunctionCallPublished)]
            if calls and not answered:
                answered = True
                d.send(SubmitFunctionOutput(calls[0].call_id, '{"time":"12:34"}', client_event_id="out-1"))
            before = d.positions
            d.run(max_positions=1)
            if d.positions == before:
                break
        port.abort()
    finally:
        api.close()
    assert [(e.name, e.arguments) for e in d.events if isinstance(e, ev.FunctionCallPublished)] == [("get_time", "{}")]
    assert [type(e).__name__ for e in d.events if isinstance(e, ev.FunctionOutputApplied)] == ["FunctionOutputApplied"]
    assert [e.text for e in d.events if isinstance(e, ev.TextDone)] == ["Hi there."]
    assert [e.status for e in d.events if isinstance(e, ev.ResponseDone)] == ["completed"]
    # With tools the EOU is its own position (not fused); then the call, the injected result, EOTR, the answer.
    eou = next(i for i, r in enumerate(port.results) if r.eou_consumed)
    assert port.controls[eou].eou_now and port.results[eou].fence_blank_count is None
    tokens = [r.function.token for r in port.results[eou + 1 :] if r.function.token]
    assert tokens[:6] == ["<SPECIAL_20>", "<TOOLCALL>", '[{"name":"get_time",', '"arguments":{}}]', "</TOOLCALL>",
                          "<SPECIAL_21>"]
    assert tokens[-1] == "<SPECIAL_22>" and len(tokens) == 6 + len(Tokenizer().encode(
        '<TOOL_RESPONSE>[{"time":"12:34"}]</TOOL_RESPONSE>')) + 1
    injected = [r for r in port.results if r.function.injecting or r.function.awaiting_eotr]
    assert all(r.agent.control is AgentControl.PAD for r in injected)  # the text channel is held meanwhile


def test_a_re_entered_position_is_not_stepped_twice(engines):
    stage0 = ThinkerStage0()
    first = engines["thinker"].respond.requests[0]
    rid = "duplex-s.reentry.e.0.r.stage0"
    req = _Req(rid, list(first.prompt_token_ids), {**first.model_intermediate_buffer, "request_id": rid})
    stage0(req)
    state = stage0.model._vc[rid]
    positions = (state.session.positions, state.rnnt.positions)
    info = {**req.model_intermediate_buffer, "_omni_num_computed_tokens": 0}  # the runner recomputes position 0
    with torch.no_grad():
        stage0.model.preprocess(torch.tensor(req.prompt_token_ids), None, **info)
    assert (state.session.positions, state.rnnt.positions) == positions and not state.pending


def _first_request(engines):
    """A real first append of a session on the thinker engine (one client turn runs if none has yet)."""
    if not engines["thinker"].respond.requests:
        client_turn(engines["thinker"])
    return engines["thinker"].respond.requests[0]


def test_a_poisoned_request_fails_its_own_session_and_the_engine_serves_the_others(engines):
    """An exception in our hooks used to propagate into the engine step (Stage 0 down for every session); now it
    is that request's evidence (``{"failed": ...}``: the port raises for that session only) and the others go on."""
    from vllm_omni_voicechat.omni.envelope import RequestFailed

    stage0 = ThinkerStage0()
    first = _first_request(engines)
    poisoned, healthy = "duplex-s.poison.e.0.r.stage0", "duplex-s.healthy.e.0.r.stage0"
    reqs = {rid: _Req(rid, list(first.prompt_token_ids), {**first.model_intermediate_buffer, "request_id": rid})
            for rid in (poisoned, healthy)}
    real = stage0.model._request

    def request(request_id, runtime):
        if request_id == poisoned:
            raise KeyError("special token ids missing from the runtime config")
        return real(request_id, runtime)

    stage0.model._request = request
    for _ in range(3):
        _, payload, _ = stage0(reqs[poisoned])  # the step completes: no exception reaches the runner
        with pytest.raises(RequestFailed, match="KeyError: 'special token ids missing"):
            decode_step(payload[EVIDENCE_KEY], b"", 0.0)
        _, payload, _ = stage0(reqs[healthy])
        assert decode_step(payload[EVIDENCE_KEY], b"", 0.0).agent.control is AgentControl.PAD
        reqs = {rid: _next_request(r) for rid, r in reqs.items()}
    stage0.model.on_requests_finished({poisoned})  # the session's abort drops the failure with the request
    assert poisoned not in stage0.model._failed and healthy in stage0.model._vc


def test_a_failure_while_finishing_a_position_is_contained_too(engines):
    stage0 = ThinkerStage0()
    first = _first_request(engines)
    rid = "duplex-s.finish.e.0.r.stage0"
    req = _Req(rid, list(first.prompt_token_ids), {**first.model_intermediate_buffer, "request_id": rid})
    stage0(req)
    state = stage0.model._vc[rid]

    def broken(raw_text, raw_fn):
        raise RuntimeError("function gate exploded")

    state.session.finish = broken
    _, payload, _ = stage0(_next_request(req))
    from vllm_omni_voicechat.omni.envelope import RequestFailed

    with pytest.raises(RequestFailed, match="RuntimeError: function gate exploded"):
        decode_step(payload[EVIDENCE_KEY], b"", 0.0)


def _next_plain(request, **runtime):
    """The next append of a vLLM-Omni session of its own (no ``vc``), its runtime config updated with ``runtime``."""
    duplex = dict(request.model_intermediate_buffer["duplex"])
    seq = int(duplex["source_input_seq"]) + 1
    duplex.update(seq=seq, source_input_seq=seq, runtime_config={**duplex["runtime_config"], **runtime},
                  payload={**duplex["payload"], "audio": base64.b64encode(bytes(1280 * 4)).decode()})
    return _Req(request.request_id, [PAD], {**request.model_intermediate_buffer, "duplex": duplex})


def _batch_step(stage0, requests):
    """One engine step over several requests, hook by hook as the AR runner does: per-request preprocess, one
    forward, make_omni_output, sampling of each request's last row, then postprocess per request."""
    from vllm_omni.model_executor.duplex_sampling import DuplexSamplingRow

    m, infos, embeds, spans = stage0.model, [], [], []
    for r in requests:
        ids = torch.tensor(list(r.prompt_token_ids))
        offset = stage0.computed.get(r.request_id, 0)
        stage0.computed[r.request_id] = offset + len(ids)
        info = {**r.model_intermediate_buffer, "_omni_num_computed_tokens": offset}
        _, e, _ = m.preprocess(ids, None, **info)
        infos.append(info)
        embeds.append(e)
        spans.append(e.shape[0])
    ends = np.cumsum(spans).tolist()
    with torch.no_grad():
        hidden = torch.tanh(stage0.backbone(torch.cat(embeds)))
        out = m.make_omni_output(hidden, model_intermediate_buffer=infos)
        logits = m.compute_logits(hidden[[end - 1 for end in ends]])
        m.prepare_duplex_sampling(logits, None, tuple(DuplexSamplingRow(i, r.request_id, None, None, None, 1)
                                                      for i, r in enumerate(requests)))
        sampled = m.sample(logits, None).sampled_token_ids[:, 0].tolist()
        updates = [m.postprocess(hidden[end - span:end], request_id=r.request_id)
                   for r, end, span in zip(requests, ends, spans)]
    return sampled, updates, out.multimodal_outputs


def test_postprocess_serves_the_in_tree_forced_function_queue_to_other_requests_and_ours_to_ours(engines):
    """Finding 7: a duplex request without our ``vc`` envelope (a vLLM-Omni session of its own) is the parent's:
    its ``function_call_output`` tokens come from the in-tree forced-function queue, while ours get our effective
    function id, in one batch, neither disturbing the other."""
    stage0 = ThinkerStage0()
    first = _first_request(engines)
    ours_id, theirs_id = "duplex-s.ours.e.0.r.stage0", "duplex-s.theirs.e.0.r.stage0"
    ours = _Req(ours_id, list(first.prompt_token_ids), {**first.model_intermediate_buffer, "request_id": ours_id})
    plain = {k: v for k, v in first.model_intermediate_buffer["duplex"].items() if k != "vc"}
    theirs = _Req(theirs_id, list(first.prompt_token_ids),
                  {**first.model_intermediate_buffer, "request_id": theirs_id, "duplex": plain})
    stage0(ours)  # each prefills alone
    stage0(theirs)
    m = stage0.model
    assert ours_id in m._vc and theirs_id not in m._vc  # only ours gets voicechat state

    # the client answers a function call on vLLM-Omni's session: the in-tree queue forces 700, then 701
    reply = {"nvc_function_response_generation": 1,
             "nvc_function_response_batches": [{"generation": 1, "token_ids": [700, 701]}]}
    ours, theirs = _next_request(ours), _next_plain(theirs, **reply)
    stage0.heads.speaking, stage0.heads.queue = True, deque(REPLY)  # both rows' greedy text: 1000 ("Hi")
    got = []
    for _ in range(3):
        sampled, updates, mm = _batch_step(stage0, [ours, theirs])
        fn = [int(u["nvc_prev_function_token"].reshape(-1)[0]) for u in updates]
        evidence = [decode_step(e, b"", 0.0) if e.numel() else None for e in mm[EVIDENCE_KEY]]
        got.append((sampled, fn, evidence))
        ours, theirs = _next_request(ours), _next_plain(theirs)
    # theirs: 700, 701 from the in-tree queue, then the function head's own (PAD); ours: our effective id
    assert [fn for _, fn, _ in got] == [[PAD, 700], [PAD, 701], [PAD, PAD]]
    # theirs: the parent holds the text at PAD while a forced token is pending, then the greedy 1000;
    # ours: the text our controls decided, as its evidence reports it; evidence for ours only
    assert [s[1] for s, _, _ in got] == [PAD, PAD, 1000]
    assert [(s[0], e[1]) for s, _, e in got] == [(e[0].agent.token_id, None) for _, _, e in got]
    assert m._sessions[theirs_id]["forced_function_tokens"] == [] and m._sessions[theirs_id]["func_token"] == PAD
    assert m._sessions[ours_id]["forced_function_tokens"] == [] and m._vc[ours_id].function == PAD


def test_a_forward_of_several_of_our_requests_gives_each_its_own_function_token_and_names_its_batch(engines):
    """vLLM-Omni's runner hands request i element i of a list output and a lone tensor to every request: the
    function token is one entry per row (a lone tensor would give one session's token to all), and each position's
    evidence says how many requests its forward carried (the engine tick's effect, ``stage0_batch``)."""
    stage0 = ThinkerStage0()
    first = _first_request(engines)
    ids = ["duplex-s.one.e.0.r.stage0", "duplex-s.two.e.0.r.stage0", "duplex-s.three.e.0.r.stage0"]
    reqs = [_Req(rid, list(first.prompt_token_ids), {**first.model_intermediate_buffer, "request_id": rid})
            for rid in ids]
    for r in reqs:
        stage0(r)  # each prefills alone
    m = stage0.model
    middle = m._vc[ids[1]].session
    real_finish = middle.finish

    def distinct(raw_text, raw_fn):  # the middle row's function channel says something else this position
        text, _, result = real_finish(raw_text, raw_fn)
        return text, 701, result

    middle.finish = distinct
    reqs = [_next_request(r) for r in reqs]
    _, _, mm = _batch_step(stage0, reqs)
    tokens = mm["nvc_function_token"]
    assert isinstance(tokens, list) and len(tokens) == 3
    assert [int(t.reshape(-1)[0]) for t in tokens] == [PAD, 701, PAD]
    evidence = [decode_step(e, b"", 0.0) for e in mm[EVIDENCE_KEY]]
    assert [e.telemetry["stage0_batch"] for e in evidence] == [3, 3, 3]
    _, _, mm = _batch_step(stage0, [_next_request(reqs[0])])
    assert decode_step(mm[EVIDENCE_KEY][0], b"", 0.0).telemetry["stage0_batch"] == 1
