"""``VoiceChatRealtimeThinker``: vLLM-Omni 0.30.0's Nemotron VoiceChat thinker plus what our runtime needs.

Registered out of tree as ``thinker.ARCHITECTURE`` (``omni/register.py``); the deploy YAML's Stage 0 names it.
Everything vLLM-Omni's thinker does (perception, AddFusion, NemotronH, the duplex prefill/continuation timeline,
the function head) is inherited unchanged. Added, per duplex request of ours (one whose positions carry our ``vc``
envelope; any other, e.g. vLLM-Omni's own sessions, is served by the parent alone) (docs/thinker.md):

* the RNNT decoder + joint (``rnnt.py``), loaded from the checkpoint tensors the in-tree loader skips, stepped
  once per position on that position's Conformer frame, state in the request's model-local state;
* the position's ``vc`` controls (``duplex["vc"]`` of the append envelope) applied by ``controls.ThinkerSession``:
  decided in ``preprocess`` (before the forward), finished in ``make_omni_output`` from the greedy text and
  function-head ids of the request's last hidden row; ``sample`` returns the effective text id and
  ``postprocess`` feeds the effective function id back into the next position's fusion;
* the ``vc_step`` evidence (``envelope.encode_evidence`` of the position's ``StepResult``) as a ``uint8`` JSON
  tensor in the step's multimodal output (``omni_client_multimodal_output_keys``), one per request.

Hook order assumed (vLLM-Omni's AR runner): ``preprocess`` per request in batch-row order -> forward ->
``make_omni_output`` -> ``compute_logits`` -> ``sample`` -> ``postprocess``. [GPU] examples/gpu_verify_thinker.py
checks it on a live engine.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch
from vllm.logger import init_logger
from vllm_omni.model_executor.models.nemotron_voicechat.nemotron_voicechat_thinker import (
    NemotronVoiceChatThinkerForConditionalGeneration,
)
from vllm_omni.model_executor.models.nemotron_voicechat.runtime_info import (
    merge_runtime_info,
    require_request_id,
)

from ...model.port import NO_CONTROLS, RnntEvidence
from ..envelope import (
    EVIDENCE_KEY,
    VC_KEY,
    decode_controls,
    encode_evidence,
    evidence_to_wire,
)
from . import perception
from .checkpoint import local_rnnt_name
from .controls import DEFAULT_TAIL_POSITIONS, SpecialIds, ThinkerSession
from .rnnt import (
    DEFAULT_MAX_SYMBOLS,
    PieceVocabulary,
    RnntModules,
    RnntStream,
    VocabFile,
)

logger = init_logger(__name__)

RNNT_TOKENIZER_DIR_ENV = "VOICECHAT_RNNT_TOKENIZER_DIR"


@dataclass
class _Request:
    """One duplex request's voicechat state (dropped with the request: a new epoch starts fresh)."""

    session: ThinkerSession
    rnnt: RnntStream | None
    text: int | None = None
    """The effective text id decided for the position in flight (``sample`` returns it)."""
    function: int | None = None
    """The effective function id of the last finished position (fed back by ``postprocess``)."""
    pending: bool = False
    last_seq: Any = None
    """The input sequence of the last position begun (a re-entered position is not stepped twice)."""


def _wire(evidence: dict) -> torch.Tensor:
    return torch.frombuffer(bytearray(evidence_to_wire(evidence)), dtype=torch.uint8)


class VoiceChatRealtimeThinker(NemotronVoiceChatThinkerForConditionalGeneration):
    omni_client_multimodal_output_keys = (
        *NemotronVoiceChatThinkerForConditionalGeneration.omni_client_multimodal_output_keys,
        EVIDENCE_KEY,
    )

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._init_voicechat()
        # The RNNT reads the Conformer output before the modality adapter / projection to the LLM width.
        self.perception.modality_adapter.register_forward_pre_hook(self._capture_encoder_frame, with_kwargs=True)

    def _init_voicechat(self, *, rnnt: RnntModules | None = None, rnnt_vocabulary: PieceVocabulary | None = None,
                        llm_tokenizer: Any = None, rnnt_max_symbols: int = DEFAULT_MAX_SYMBOLS,
                        tail_positions: int = DEFAULT_TAIL_POSITIONS) -> None:
        """Our state; tests call it on a bare instance with tiny modules and fakes."""
        self.rnnt = rnnt
        self.rnnt_max_symbols = rnnt_max_symbols
        self.tail_positions = tail_positions
        self._rnnt_vocabulary = rnnt_vocabulary
        self._llm_tokenizer = llm_tokenizer
        self._vc: dict[str, _Request] = {}
        self._failed: dict[str, str] = {}
        """Requests whose voicechat hooks raised: each gets a failure in its evidence, the engine serves the rest."""
        self._step_rows: list[tuple[str, int]] = []
        self._captured_encoder_frame: torch.Tensor | None = None

    # ---- tokenizers (lazy on the engine; injected in tests) ----

    def _tokenizer(self) -> Any:
        if self._llm_tokenizer is None:
            from transformers import AutoTokenizer

            ref = os.environ.get("NEMOTRON_VOICECHAT_LLM_PATH") or self.stt_cfg.get(
                "pretrained_llm", "nvidia/NVIDIA-Nemotron-Nano-9B-v2")
            self._llm_tokenizer = AutoTokenizer.from_pretrained(ref, trust_remote_code=False)
        return self._llm_tokenizer

    @functools.cached_property
    def _decode(self):
        tokenizer = self._tokenizer()

        @functools.lru_cache(maxsize=65536)
        def decode(token_id: int) -> str:
            return tokenizer.decode([token_id], skip_special_tokens=False)

        return decode

    def _vocabulary(self) -> PieceVocabulary:
        if self._rnnt_vocabulary is None:
            folder = os.environ.get(RNNT_TOKENIZER_DIR_ENV)
            if folder is None:
                model = str(self.vllm_config.model_config.model)
                if not os.path.isdir(model):
                    from huggingface_hub import snapshot_download

                    model = snapshot_download(model, allow_patterns=["rnnt_tokenizer/*"])
                folder = os.path.join(model, "rnnt_tokenizer")
            self._rnnt_vocabulary = VocabFile.load(folder)
        return self._rnnt_vocabulary

    # ---- per-request state ----

    def _request(self, request_id: str, runtime: dict[str, Any]) -> _Request:
        req = self._vc.get(request_id)
        if req is None:
            session = ThinkerSession(SpecialIds.from_runtime(runtime), lambda t: self._decode(int(t)),
                                     tail_positions=self.tail_positions)
            stream = (RnntStream(self.rnnt, self._vocabulary(), max_symbols=self.rnnt_max_symbols)
                      if self.rnnt is not None else None)
            req = self._vc[request_id] = _Request(session, stream)
        return req

    def _capture_encoder_frame(self, module: Any, args: tuple, kwargs: dict) -> None:
        encoded = kwargs.get("audio_signal", args[0] if args else None)
        if isinstance(encoded, torch.Tensor):
            self._captured_encoder_frame = encoded[0, :, -1].detach()  # [B, D, T] -> the newest frame

    def _duplex_stable_frame(self, session: dict[str, Any], duplex: dict[str, Any], device: torch.device):
        self._captured_encoder_frame = None
        stable = super()._duplex_stable_frame(session, duplex, device)
        if self._captured_encoder_frame is not None:  # a fresh frame (the parent caches per input sequence)
            session["vc_encoder_frame"] = self._captured_encoder_frame
            session["vc_perceived_with"] = 1
        session["vc_projected_frame"] = stable.reshape(-1)
        return stable

    def _rnnt_frame(self, session: dict[str, Any]) -> torch.Tensor:
        assert self.rnnt is not None
        for key in ("vc_encoder_frame", "vc_projected_frame"):
            frame = session.get(key)
            if isinstance(frame, torch.Tensor) and frame.numel() == self.rnnt.enc_hidden:
                return frame
        raise RuntimeError(f"voicechat thinker: no perception frame of the RNNT joint's width {self.rnnt.enc_hidden}")

    # ---- Omni AR hooks ----

    def preprocess_batch(self, *, req_ids: list[str], model_intermediate_buffer: dict[str, Any],
                         device: torch.device) -> None:
        """vLLM-Omni's batch hook, run before the per-request ``preprocess``: where two or more of our streams
        continue in this forward, their new frames are perceived together (``perception.py``) and stored where the
        parent keeps a perceived frame, so each request's ``preprocess`` fuses it as it would its own."""
        streams = []
        for request_id in req_ids:
            info = merge_runtime_info(model_intermediate_buffer.get(request_id) or {})
            duplex = self._duplex_info(info)
            session = self._sessions.get(str(request_id))
            if duplex is not None and session is not None and str(request_id) not in self._failed \
                    and self._is_ours(str(request_id), duplex):
                streams.append((session, duplex))
        if len(streams) < 2:
            return  # a lone stream: the parent's own path, and no window cut twice
        windows = []
        for session, duplex in streams:
            try:
                window = perception.cut(self, session, duplex, device)
            except Exception:  # the parent's own path meets it again and fails only this request
                window = None
            if window is not None:
                windows.append(window)  # one row alone is encoded as the parent would: its window is not cut twice
        if not windows:
            return
        try:
            done = perception.perceive_together(self, perception.featurize(self, windows))
        except Exception:  # nothing was written: every row takes the parent's per-request path
            logger.exception("voicechat thinker: perceiving %d frames together failed; perceiving each alone",
                             len(windows))
            return
        for row, update in done:
            row.session.update(update)

    def preprocess(self, input_ids: torch.Tensor, input_embeds: torch.Tensor | None, **info_dict: Any):
        info = merge_runtime_info(info_dict)
        request_id = require_request_id(info, "thinker")
        if any(rid == request_id for rid, _ in self._step_rows):
            self._step_rows = []  # a new engine step began without make_omni_output (e.g. a dummy run)
        self._step_rows.append((request_id, int(input_ids.shape[0])))
        return super().preprocess(input_ids, input_embeds, **info_dict)

    def _is_ours(self, request_id: str, duplex: dict[str, Any]) -> bool:
        """Ours once a position carries our ``vc`` envelope (our port's sessions). Any other duplex request
        (vLLM-Omni's own sessions) is the parent's alone, its ``function_call_output`` forced-function queue
        included: voicechat state would take over its sampling and function channel."""
        return request_id in self._vc or request_id in self._failed or isinstance(duplex.get(VC_KEY), dict)

    def _preprocess_duplex(self, *, request_id: str, input_ids: torch.Tensor, info: dict[str, Any],
                           duplex: dict[str, Any]):
        ours = self._is_ours(request_id, duplex)
        if ours:
            # Our function channel is the session's ``func_token`` (set from the effective id in
            # make_omni_output); a stale runner payload must not override it.
            info = {k: v for k, v in info.items() if k != "nvc_prev_function_token"}
        ids, embeds, update = super()._preprocess_duplex(request_id=request_id, input_ids=input_ids, info=info,
                                                         duplex=duplex)
        if not ours:
            return ids, embeds, update
        session = self._sessions[request_id]
        offset = max(0, int(info.get("_omni_num_computed_tokens", 0) or 0))
        if offset + int(input_ids.shape[0]) < int(session["prefill_embeds"].shape[0]):
            return ids, embeds, update  # an inner prefill chunk: acoustic frame 0 is not in this span
        if request_id in self._failed:
            return ids, embeds, update  # a failed request runs on unchanged until its session aborts it
        try:
            self._begin_position(request_id, duplex, session)
        except Exception as exc:  # never into the engine core: that would stop Stage 0 for every session
            self._fail(request_id, exc)
        return ids, embeds, update

    def _fail(self, request_id: str, exc: BaseException) -> None:
        logger.exception("voicechat thinker: request %s failed; its session gets the error", request_id)
        self._failed[request_id] = f"voicechat thinker: {type(exc).__name__}: {exc}"
        req = self._vc.get(request_id)
        if req is not None:
            req.pending, req.text = False, None

    def _begin_position(self, request_id: str, duplex: dict[str, Any], session: dict[str, Any]) -> None:
        runtime = duplex.get("runtime_config") or {}
        req = self._request(request_id, runtime)
        seq = duplex.get("source_input_seq")
        if seq is not None and seq == req.last_seq:
            return  # the runner re-entered this position (recompute): already begun/finished
        req.last_seq = seq
        vc = duplex.get(VC_KEY)
        controls = decode_controls(vc) if isinstance(vc, dict) else NO_CONTROLS
        rnnt = RnntEvidence()
        if req.rnnt is not None:
            rnnt, _ = req.rnnt.step(self._rnnt_frame(session))
        tool_ids: list[int] = []
        if isinstance(vc, dict):
            tool_ids = [int(t) for t in vc.get("tool_result_token_ids") or ()]
            if not tool_ids and controls.tool_result_tokens:
                tool_ids = list(self._tokenizer().encode("".join(controls.tool_result_tokens),
                                                         add_special_tokens=False))
        frame = int(vc["position"]) if isinstance(vc, dict) and "position" in vc else None
        if req.pending:  # the previous position never reached make_omni_output: close it as PAD, keep serving
            logger.error("voicechat thinker: request %s position left unfinished; closed as PAD", request_id)
            pad = req.session.ids.pad
            req.session.finish(pad, pad)
        req.session.begin(controls, rnnt, frame=frame, tool_result_ids=tool_ids)
        req.pending = True

    def make_omni_output(self, model_outputs: Any, **kwargs: Any):
        out = super().make_omni_output(model_outputs, **kwargs)
        rows, self._step_rows = self._step_rows, []
        hidden = out.text_hidden_states
        finished: dict[str, torch.Tensor] = {}
        offset = 0
        for request_id, span in rows:
            offset += span
            req = self._vc.get(request_id)
            if request_id not in self._failed and req is not None and req.pending:
                try:
                    finished[request_id] = self._finish_position(request_id, req, hidden[offset - 1 : offset],
                                                                 batch=len(rows))
                except Exception as exc:
                    self._fail(request_id, exc)
            if request_id in self._failed:
                finished[request_id] = _wire({"failed": self._failed[request_id]})
        if finished:
            info_dicts = kwargs.get("model_intermediate_buffer") or kwargs.get("runtime_additional_information")
            order = [i.get("request_id") if isinstance(i, dict) else None for i in info_dicts or ()]
            if not order:
                order = [rid for rid, _ in rows]
            # One entry per request, in batch order: vLLM-Omni's runner gives request i element i of a list (and a
            # lone tensor to every request, which would hand one session's function token to all of them).
            empty = torch.zeros(0, dtype=torch.uint8)
            no_token = torch.zeros(0, dtype=torch.long)
            mm = out.multimodal_outputs
            mm[EVIDENCE_KEY] = [finished.get(rid, empty) for rid in order]
            mm["nvc_function_token"] = [
                torch.tensor([self._vc[rid].function], dtype=torch.long)
                if rid in finished and rid not in self._failed else no_token
                for rid in order
            ]
        return out

    def _finish_position(self, request_id: str, req: _Request, last: torch.Tensor, *, batch: int = 1) -> torch.Tensor:
        req.pending = False
        pad = req.session.ids.pad
        with torch.inference_mode():
            raw_text = int(self.compute_logits(last).argmax(dim=-1).reshape(-1)[0])
            raw_fn = (int(self.function_head(last.to(self._dtype)).argmax(dim=-1).reshape(-1)[0])
                      if self._use_function_head else pad)
        text, fn, result = req.session.finish(raw_text, raw_fn)
        req.text, req.function = text, fn
        self._sessions[request_id]["func_token"] = fn
        evidence = encode_evidence(result)
        evidence["telemetry"]["stage0_batch"] = batch  # the requests this forward carried (the engine tick's effect)
        # the frames its perception was encoded with (preprocess_batch), itself included
        evidence["telemetry"]["perceived_with"] = int(self._sessions[request_id].get("vc_perceived_with", 1))
        return _wire(evidence)

    def sample(self, logits: torch.Tensor, sampling_metadata: Any):
        rows = dict(self._duplex_sampling_rows)
        out = super().sample(logits, sampling_metadata)
        if out is None:
            return None
        for row_idx, request_id in rows.items():
            req = self._vc.get(request_id)
            if req is not None and req.text is not None:
                out.sampled_token_ids[row_idx, 0] = req.text
                self._duplex_previous_text_tokens[request_id] = req.text  # the next position's text channel
                req.text = None
        return out

    def postprocess(self, hidden_states: torch.Tensor, **kwargs: Any) -> dict[str, Any]:
        request_id = kwargs.get("request_id")
        req = self._vc.get(request_id) if isinstance(request_id, str) else None
        if req is None:  # not ours: the parent's path, its forced-function queue included
            return super().postprocess(hidden_states, **kwargs)
        # Ours: the effective id decided in make_omni_output. Our tool results ride ``vc``, never the parent's
        # queue, so it is not served here; no finished position yet (it failed) feeds nothing back.
        if req.function is None:
            return {}
        return {"nvc_prev_function_token": torch.tensor([req.function], dtype=torch.long)}

    def on_requests_finished(self, finished_req_ids: set[str] | list[str]) -> None:
        super().on_requests_finished(finished_req_ids)
        for request_id in finished_req_ids:
            self._vc.pop(str(request_id), None)  # abort / epoch end: RNNT and control state go with it
            self._failed.pop(str(request_id), None)

    # ---- weights ----

    def load_weights(self, weights):
        rnnt_state: dict[str, torch.Tensor] = {}

        def without_rnnt():
            for name, tensor in weights:
                local = local_rnnt_name(name)
                if local is None:
                    yield name, tensor
                else:
                    rnnt_state[local] = tensor

        loaded = super().load_weights(without_rnnt())
        if not rnnt_state:
            raise ValueError("voicechat thinker: the checkpoint has no RNNT decoder/joint tensors "
                             "(names with an 'rnnt' prefix and NeMo's prediction/joint structure)")
        device = self.vllm_config.device_config.device
        self.rnnt = RnntModules.from_state_dict(rnnt_state).to(device=device, dtype=torch.float32)
        logger.info("voicechat thinker: RNNT loaded (%d tensors, vocabulary %d, encoder width %d)",
                    len(rnnt_state), self.rnnt.vocab_size, self.rnnt.enc_hidden)
        # Resolved here, not at a session's first position or first word: a download or a missing file inside an
        # engine step would stall or kill Stage 0 for every session (both honour HF_HUB_OFFLINE and local paths).
        vocabulary = self._vocabulary()
        self._decode  # noqa: B018 - loads the text tokenizer now
        logger.info("voicechat thinker: RNNT vocabulary (%d pieces) and text tokenizer resolved",
                    len(getattr(vocabulary, "pieces", ()) or ()))
        return loaded | {f"rnnt.{name}" for name in rnnt_state}
