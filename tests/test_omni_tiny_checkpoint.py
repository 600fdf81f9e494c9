"""The tiny random checkpoint (``omni/tiny``): deterministic, small, and loaded by every stage through the same
loaders as the real checkpoint.

Each stage model is built the way a vLLM-Omni stage worker builds it: ``OmniEngineArgs`` -> ``create_engine_config``
(the NeMo ``config.json`` patched to ``nemotron_voicechat`` and parsed by ``NemotronVoiceChatConfig``), then vLLM's
``DefaultModelLoader.load_model`` (its strict "every parameter loaded" tracking included) streaming
``model.safetensors``. On top of that each test accounts for every tensor in the file: consumed by exactly the
modules that should consume it, none left over. The one deliberate skip: vLLM-Omni's in-tree thinker ignores the
RNNT tensors (``stt_model.rnnt_*``), which our thinker subclass loads.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")
pytest.importorskip("vllm_omni")

from safetensors import safe_open

from vllm_omni_voicechat.omni.thinker.checkpoint import is_rnnt_name, local_rnnt_name
from vllm_omni_voicechat.omni.tiny import LLM_FOLDER, RNNT_FOLDER, make_tiny_checkpoint
from vllm_omni_voicechat.omni.tiny import config as tiny_config

FRAME_IN, FRAME_OUT = 1280, 1764  # samples per 80 ms position: 16 kHz in, 22.05 kHz out
MAX_BYTES = 8 * 1024 * 1024


def read_tensors(root: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(root / "model.safetensors"), "pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", seed=0)


@pytest.fixture(scope="module")
def tensors(checkpoint) -> dict[str, torch.Tensor]:
    return read_tensors(checkpoint)


@pytest.fixture(scope="module")
def distributed():
    """vLLM's world-size-1 process groups on gloo, as a CPU stage worker sets them up (once per module)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                                     local_rank=0, backend="gloo")
        ensure_model_parallel_initialized(1, 1)
    yield
    destroy_model_parallel()
    destroy_distributed_environment()


def build_stage(checkpoint: Path, inspect=None, **engine_args):
    """(vllm_config, model) for one stage: the stage worker's engine config, then vLLM's ``load_model`` steps
    (``BaseModelLoader.load_model``) with ``inspect(model)`` run after the weights are loaded and before the
    platform repacks them (CPU linears move their weights into kernel-specific buffers)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm_omni.engine.arg_utils import OmniEngineArgs

    args = OmniEngineArgs(model=str(checkpoint), enforce_eager=True, max_num_seqs=1, enable_prefix_caching=False,
                          worker_cls="auto", **engine_args)
    vllm_config = args.create_engine_config()
    model_config = vllm_config.model_config
    loader = get_model_loader(vllm_config.load_config)
    device = torch.device(vllm_config.device_config.device)
    with set_current_vllm_config(vllm_config), set_default_torch_dtype(model_config.dtype):
        with device:
            model = loader.create_model(vllm_config=vllm_config, model_config=model_config)
        loader.load_weights(model, model_config)  # DefaultModelLoader: strict "every parameter loaded" tracking
        if inspect is not None:
            inspect(model)
        process_weights_after_loading(model, model_config, device)
    return vllm_config, model.eval()


def thinker_args(checkpoint: Path, arch: str) -> dict:
    # The deploy YAML's stage 0 (bf16, fp32 Mamba state) with our explicit text tokenizer.
    return dict(model_arch=arch, model_stage="thinker", stage_id=0, dtype="bfloat16", max_model_len=512,
                mamba_ssm_cache_dtype="float32", tokenizer=str(checkpoint / LLM_FOLDER))


def talker_args(native: bool) -> dict:
    return dict(model_arch="NemotronVoiceChatTalkerForConditionalGeneration", model_stage="talker", stage_id=1,
                hf_config_name="talker_config", dtype="float32", max_model_len=4096, skip_tokenizer_init=True,
                max_num_batched_tokens=64,
                hf_overrides={"use_native_talker": native, "talker_init_len": tiny_config.SPEAKER_PROMPT_FRAMES,
                              "async_chunk_prewarm_prompt_len": tiny_config.SPEAKER_PROMPT_FRAMES})


# ---- files -----------------------------------------------------------------------------------------------------


def test_layout_is_the_real_one_at_a_few_megabytes(checkpoint, tensors):
    files = {str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file()}
    assert files == {
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
        f"{LLM_FOLDER}/config.json", f"{LLM_FOLDER}/tokenizer.json", f"{LLM_FOLDER}/tokenizer_config.json",
        f"{RNNT_FOLDER}/tokenizer.vocab", f"{RNNT_FOLDER}/tokenizer.json",
        f"{RNNT_FOLDER}/tokenizer_config.json",
    }
    assert sum((checkpoint / f).stat().st_size for f in files) < MAX_BYTES
    assert {t.dtype for t in tensors.values()} == {torch.float32, torch.int64}  # the real file is all F32 (+ ids)
    stages = {"stt_model": 0, "tts_model.audio_codec": 0, "tts_model": 0}
    for name in tensors:
        stages[next(p for p in stages if name.startswith(p + "."))] += 1
    assert all(stages.values()), stages
    raw = json.loads((checkpoint / "config.json").read_text())
    assert "model_type" not in raw and "architectures" not in raw  # like the real NeMo config.json
    assert raw["model"]["stt"]["model"]["pretrained_llm"] == str(checkpoint / LLM_FOLDER)


def test_same_seed_same_bytes_and_only_config_names_the_folder(tmp_path, checkpoint):
    again = make_tiny_checkpoint(tmp_path / "again", seed=0)
    first, second = tree_bytes(checkpoint), tree_bytes(again)
    assert first.keys() == second.keys()
    differing = {name for name in first if first[name] != second[name]}
    assert differing == {"config.json"}
    assert first["config.json"].replace(str(checkpoint).encode(), str(again).encode()) == second["config.json"]
    assert tree_bytes(make_tiny_checkpoint(again, seed=0)) == second  # rewriting in place: identical
    other = make_tiny_checkpoint(tmp_path / "other", seed=1)
    assert (other / "model.safetensors").read_bytes() != second["model.safetensors"]


def test_cli_writes_the_same_checkpoint(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "vllm_omni_voicechat.cli", "make-tiny-checkpoint",
                           str(tmp_path / "cli"), "--seed", "2"], capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stderr
    direct = make_tiny_checkpoint(tmp_path / "direct", seed=2)
    assert (tmp_path / "cli" / "model.safetensors").read_bytes() == (direct / "model.safetensors").read_bytes()
    assert str(tmp_path / "cli") in done.stdout


def test_config_resolves_offline_into_the_three_stage_configs(checkpoint):
    from vllm_omni.model_executor.models.nemotron_voicechat.configuration_nemotron_voicechat import (
        NemotronVoiceChatConfig,
    )

    cfg = NemotronVoiceChatConfig(**json.loads((checkpoint / "config.json").read_text()))
    text = cfg.get_text_config()
    assert text.model_type == "nemotron_h" and text.hybrid_override_pattern == "M*-M-"
    assert (text.hidden_size, text.vocab_size, text.head_dim) == (64, 1024, 32)
    talker = cfg.talker_config
    assert (talker.hidden_size, talker.head_dim, talker.num_attention_heads) == (64, 64, 2)  # CPU-attention size
    codec = cfg.code2wav_config
    assert (codec.num_quantizers, codec.codebook_size, codec.wav_to_token_ratio, codec.sample_rate) == \
        (31, 64, FRAME_OUT, 22050)
    assert cfg.stt_cfg["duplex_function_channel_weight"] == 2.0 and cfg.inference_speaker_name == "Aria"
    assert (cfg.frame_length, cfg.source_sample_rate, cfg.target_sample_rate) == (0.08, 16000, 22050)


def test_text_tokenizer_has_the_model_special_ids_and_encodes_prompts_and_tool_json(checkpoint):
    from transformers import AutoTokenizer
    from vllm_omni.model_executor.models.nemotron_voicechat.configuration_nemotron_voicechat import (
        NemotronVoiceChatConfig,
    )
    from vllm_omni.model_executor.models.nemotron_voicechat.duplex.plugin import _load_tokenizer_runtime

    tok = AutoTokenizer.from_pretrained(str(checkpoint / LLM_FOLDER))
    assert len(tok) == 1024
    ids = tok.convert_tokens_to_ids(["<unk>", "<s>", "</s>", "<SPECIAL_12>", "<SPECIAL_20>", "<SPECIAL_21>",
                                     "<SPECIAL_22>"])
    assert ids == [0, 1, 2, 12, 20, 21, 22]
    assert tok.eos_token == "<SPECIAL_12>"  # the Nano tokenizer's own EOS is the PAD literal (model.md §3)
    text = ('You are a helpful voice assistant. <AVAILABLE_TOOLS>[{"name": "get_time"}]</AVAILABLE_TOOLS>'
            '<TOOLCALL>[{"name":"get_time","arguments":{"timezone":"UTC"}}]</TOOLCALL>'
            '<TOOL_RESPONSE>["12:30 ünïcode ✓"]</TOOL_RESPONSE>')
    encoded = tok.encode(text, add_special_tokens=False)
    assert tok.decode(encoded) == text
    assert tok.encode("<TOOLCALL>", add_special_tokens=False) == [tok.convert_tokens_to_ids("<TOOLCALL>")]
    assert max(encoded) < 1024 and 0 not in encoded  # byte-level: nothing is unknown
    assert tok.tokenize(" You are a helpful assistant") == ["\u0120You", "\u0120are", "\u0120a", "\u0120helpful",
                                                            "\u0120assistant"]  # merged words stay whole
    # vLLM-Omni's duplex plugin resolves the session ids from config.json's pretrained_llm.
    model_config = type("ModelConfig", (), {})()
    model_config.hf_config = NemotronVoiceChatConfig(**json.loads((checkpoint / "config.json").read_text()))
    runtime, _ = _load_tokenizer_runtime(model_config)
    assert {k: runtime[k] for k in ("nvc_text_bos_id", "nvc_text_eos_id", "nvc_text_pad_id",
                                    "nvc_function_sotc_id", "nvc_function_eotc_id", "nvc_function_eotr_id")} == {
        "nvc_text_bos_id": 1, "nvc_text_eos_id": 2, "nvc_text_pad_id": 12, "nvc_function_sotc_id": 20,
        "nvc_function_eotc_id": 21, "nvc_function_eotr_id": 22}


def test_rnnt_vocabulary_matches_the_joint(checkpoint, tensors):
    from vllm_omni_voicechat.omni.thinker.rnnt import VocabFile

    vocabulary = VocabFile.load(checkpoint / RNNT_FOLDER)
    blank_plus_vocab = tensors["stt_model.rnnt_decoder.prediction.embed.weight"].shape[0]
    assert len(vocabulary.pieces) + 1 == blank_plus_vocab == 65
    assert vocabulary.id_to_piece(0) == "<unk>" and vocabulary.id_to_piece(1) == "\u2581"


# ---- stage 0: the thinker ------------------------------------------------------------------------------------------


def perception_names(tensors) -> set[str]:
    return {n.removeprefix("stt_model.perception.") for n in tensors if n.startswith("stt_model.perception.")}


def assert_thinker_tensors_accounted(model, tensors, checkpoint):
    """Every stt_model.* tensor has a consumer: perception (exact state-dict match), the NemotronH backbone (HF
    names; vLLM's loader rejects any name it cannot place), the shared embedding and the two heads, or the RNNT."""
    from transformers import AutoConfig, AutoModelForCausalLM

    stt = {n for n in tensors if n.startswith("stt_model.")}
    assert stt == {n for n in tensors if not n.startswith("tts_model.")}
    assert perception_names(tensors) == set(model.perception.state_dict())
    hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(checkpoint / LLM_FOLDER)))
    inner = hf.base_model_prefix + "."  # transformers 5 names NemotronH's body "model." (older: "backbone.")
    hf_backbone = {k.removeprefix(inner): tuple(v.shape) for k, v in hf.state_dict().items()
                   if k.startswith(inner) and not k.startswith(inner + "embeddings.")}
    llm = {n.removeprefix("stt_model.llm."): tuple(t.shape) for n, t in tensors.items()
           if n.startswith("stt_model.llm.")}
    assert llm == hf_backbone
    heads = {"stt_model.embed_tokens.weight", "stt_model.lm_head.weight", "stt_model.function_head.weight"}
    rnnt = {n for n in stt if is_rnnt_name(n)}
    assert all(local_rnnt_name(n) for n in rnnt) and len(rnnt) == 1 + 4 * 2 + 6  # embed, 2 LSTM layers, joint
    assert stt == {f"stt_model.perception.{n}" for n in perception_names(tensors)} | \
        {f"stt_model.llm.{n}" for n in llm} | heads | rnnt
    return rnnt


def test_in_tree_thinker_loads_everything_but_the_rnnt(distributed, checkpoint, tensors):
    _, model = build_stage(checkpoint, **thinker_args(checkpoint, "NemotronVoiceChatThinkerForConditionalGeneration"))
    assert_thinker_tensors_accounted(model, tensors, checkpoint)
    assert not any("rnnt" in n for n, _ in model.named_parameters())  # skipped: vLLM-Omni 0.30 has no RNNT
    assert model._resolve_special_ids() == {"bos": 1, "eos": 2, "pad": 12}
    assert (model._w_text, model._w_audio, model._w_func) == (1.0, 1.0, 2.0)
    # The file's mel frontend is what the featurizer computes at construction (window, Slaney filterbank).
    from omegaconf import DictConfig
    from vllm_omni.model_executor.models.nemotron_voicechat.nemo_vendored.perception import AudioPerceptionModule

    fresh = AudioPerceptionModule(DictConfig(tiny_config.PERCEPTION)).state_dict()
    for name in ("preprocessor.featurizer.window", "preprocessor.featurizer.fb"):
        torch.testing.assert_close(tensors[f"stt_model.perception.{name}"], fresh[name], atol=1e-6, rtol=1e-5)


@pytest.fixture(scope="module")
def our_thinker(distributed, checkpoint):
    from vllm_omni_voicechat.omni.thinker import ARCHITECTURE, register_architecture

    register_architecture()
    return build_stage(checkpoint, **thinker_args(checkpoint, ARCHITECTURE))[1]


def test_our_thinker_loads_every_thinker_tensor_including_the_rnnt(our_thinker, checkpoint, tensors):
    rnnt = assert_thinker_tensors_accounted(our_thinker, tensors, checkpoint)
    assert {f"rnnt.{local_rnnt_name(n)}" for n in rnnt} == {f"rnnt.{n}" for n, _ in our_thinker.rnnt.named_parameters()}
    for name in rnnt:
        assert torch.equal(our_thinker.rnnt.state_dict()[local_rnnt_name(name)], tensors[name]), name  # fp32
    assert (our_thinker.rnnt.vocab_size, our_thinker.rnnt.enc_hidden) == (64, 32)
    assert len(our_thinker._vocabulary().pieces) == 64  # DIR/rnnt_tokenizer, found from the model path
    assert our_thinker._tokenizer().convert_tokens_to_ids("<SPECIAL_20>") == 20


def test_streaming_perception_gives_one_embedding_per_80_ms_frame_and_feeds_the_rnnt(our_thinker):
    from vllm_omni_voicechat.omni.thinker.rnnt import RnntStream

    g = torch.Generator().manual_seed(0)
    session: dict = {}
    stream = RnntStream(our_thinker.rnnt, our_thinker._vocabulary())
    for seq in (1, 2, 3):
        pcm = (torch.randn(FRAME_IN, generator=g) * 0.1).numpy().astype("<f4").tobytes()
        duplex = {"source_input_seq": seq, "payload": {"format": "pcm_f32le", "sample_rate_hz": 16000,
                                                        "audio": base64.b64encode(pcm).decode()}}
        frame = our_thinker._duplex_stable_frame(session, duplex, torch.device("cpu"))
        assert frame.shape == (1, tiny_config.LLM_HIDDEN) and torch.isfinite(frame.float()).all()
        encoder_frame = our_thinker._rnnt_frame(session)
        assert encoder_frame.shape == (tiny_config.PERCEPTION["encoder"]["d_model"],)
        evidence, tokens = stream.step(encoder_frame)
        assert evidence.blank == (not tokens) and all(0 <= t < 64 for t in tokens)


def test_our_thinker_perceives_a_forwards_frames_together_as_each_alone(our_thinker):
    """vLLM-Omni's runner calls ``preprocess_batch`` before each request's ``preprocess``: our thinker perceives
    every continuing stream's new frame in one encoder call (omni/thinker/perception.py) and stores it where the
    parent keeps a perceived frame, the forward's windows of one length featurized in one call. Four streams (one
    begun three frames later, its encoder cache less full) perceived together leave every stream, its caches and its
    fused frame exactly as perceiving each alone does; a stream's first frame, a repeat and a gap stay the parent's."""
    import copy

    from vllm_omni_voicechat.omni.thinker import perception

    cpu = torch.device("cpu")
    g = torch.Generator().manual_seed(4)
    pcm = [[base64.b64encode((torch.randn(FRAME_IN, generator=g) * 0.1).numpy().astype("<f4").tobytes()).decode()
            for _ in range(30)] for _ in range(4)]

    def duplex(stream, seq):
        return {"data_plane": True, "source_input_seq": seq, "vc": {},
                "payload": {"format": "pcm_f32le", "sample_rate_hz": 16000, "audio": pcm[stream][seq - 1]}}

    starts = [1, 1, 4, 1]  # stream 2 begins later: its cache is less full
    sessions = [{} for _ in range(4)]
    alone = [{} for _ in range(4)]
    for stream in range(4):  # each stream's first frames, the parent's path
        for seq in range(1, starts[stream] + 3):
            our_thinker._duplex_stable_frame(sessions[stream], duplex(stream, seq), cpu)
    together = copy.deepcopy(sessions)
    seqs = [starts[stream] + 2 for stream in range(4)]
    batched = 0
    featurized: list[int] = []  # the featurizer's batch sizes
    hook = our_thinker._streaming_preprocessor.register_forward_hook(
        lambda module, args, kwargs, out: featurized.append(int(kwargs["input_signal"].shape[0])), with_kwargs=True)
    for _ in range(12):
        seqs = [seq + 1 for seq in seqs]
        for stream in range(4):
            our_thinker._duplex_stable_frame(alone[stream] or sessions[stream], duplex(stream, seqs[stream]), cpu)
            alone[stream] = alone[stream] or sessions[stream]
        windows = [perception.cut(our_thinker, together[i], duplex(i, seqs[i]), cpu) for i in range(4)]
        assert all(window is not None for window in windows)
        rows = perception.featurize(our_thinker, windows)
        for row, update in perception.perceive_together(our_thinker, rows):
            row.session.update(update)
        batched += 1
        for stream in range(4):
            our_thinker._duplex_stable_frame(together[stream], duplex(stream, seqs[stream]), cpu)  # stored: reused
            for key in ("duplex_frame", "vc_encoder_frame", *perception.CACHE_KEYS, "duplex_audio"):
                assert torch.equal(together[stream][key], alone[stream][key]), (stream, seqs[stream], key)
            assert together[stream]["last_input_seq"] == alone[stream]["last_input_seq"] == seqs[stream]
    hook.remove()
    assert batched == 12
    assert featurized == [1, 1, 1, 1, 4] * 12  # each alone (the parent's), then the four windows in one call
    # one encoder call for the streams whose caches are equally full, one for the later stream
    keys = [row.key() for row in rows]
    assert [[i for i, k in enumerate(keys) if k == key] for key in dict.fromkeys(keys)] == [[0, 1, 3], [2]]

    # not a plain continuation: the parent's
    assert perception.prepare(our_thinker, together[0], duplex(0, seqs[0] + 2), cpu) is None  # a gap
    assert perception.prepare(our_thinker, together[0], duplex(0, seqs[0]), cpu) is None  # a repeat
    assert perception.prepare(our_thinker, {}, duplex(0, 1), cpu) is None  # a first frame


# ---- stage 1: the talker -------------------------------------------------------------------------------------------


def talker_names(tensors) -> set[str]:
    return {n for n in tensors if n.startswith("tts_model.")}


def test_vendored_talker_state_is_exactly_the_checkpoint(distributed, checkpoint, tensors):
    from vllm_omni.model_executor.models.nemotron_voicechat.nemo_vendored.duplex_ear_tts import DuplexEARTTS
    from vllm_omni.model_executor.models.nemotron_voicechat.nemotron_voicechat_talker import sanitize_tts_model_cfg

    _, model = build_stage(checkpoint, **talker_args(native=False))
    state = {f"tts_model.{k}": v for k, v in model.tts.state_dict().items()}
    assert set(state) == talker_names(tensors)
    for name, value in state.items():
        assert torch.equal(value, tensors[name]), name
    # The tokenizer-derived buffers equal what the module computes from the text tokenizer at construction.
    sg = json.loads((checkpoint / "config.json").read_text())["model"]["speech_generation"]
    fresh = DuplexEARTTS({"data": sg["data"], "model": sanitize_tts_model_cfg(sg["model"])}).state_dict()
    for name in ("subword_flag_emb.pad_tensor", "subword_flag_emb.is_continuation", "bos_eos_emb.pad_tensor",
                 "bos_eos_emb.special_flags"):
        assert torch.equal(fresh[f"tts_model.embed_subword.{name}"],
                           tensors[f"tts_model.tts_model.embed_subword.{name}"]), name
    assert torch.equal(fresh["_control_codes"], tensors["tts_model._control_codes"])
    # One eager EAR-TTS step from the pre-baked speaker prompt: 37 prompt frames, then one 31-code frame.
    tts = model.tts
    tts.set_init_inputs(speaker_name="Aria")
    init = tts.get_init_inputs(B=1)
    assert init["code"].shape == (1, tiny_config.SPEAKER_PROMPT_FRAMES, 31)
    assert init["audio_prompt_latent"].shape == (1, tiny_config.SPEAKER_PROMPT_FRAMES, 64)
    with torch.inference_mode():
        out = tts.tts_model(**init, use_cache=True, past_key_values=None, guidance_enabled=True)
        code, _ = tts.infer_codes_one_step(
            current_subword_id=torch.tensor([[12]]), prev_subword_id=init["subword_ids"][:, -1:],
            current_subword_mask=torch.ones(1, 1, dtype=torch.bool), prev_audio_tokens=init["code"][:, -1:],
            past_key_values=out.past_key_values, guidance_enabled=True,
            generation_config=tts._get_generation_config(True))
    assert code.shape == (1, 1, 31) and 0 <= int(code.min()) and int(code.max()) < 64


def test_native_talker_loads_its_gemma3_backbone_and_the_rest(distributed, checkpoint, tensors):
    from vllm_omni.model_executor.models.nemotron_voicechat.talker_native import build_prefill_embeds

    backbone = "tts_model.tts_model.backbone."
    used: set[str] = set()

    def backbone_holds_the_checkpoint(model) -> None:
        # Every vLLM Gemma3 parameter holds the checkpoint's values (q/k/v and gate/up fused by vLLM's loader).
        fused_parts = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
        for name, param in model.backbone.named_parameters():
            if name in ("model.embed_tokens.weight", "lm_head.weight"):  # the dummy vocab (talker_native.py)
                continue
            source = backbone + name.removeprefix("model.")
            fused = next((k for k in fused_parts if f".{k}." in source), None)
            names = [source.replace(fused, part) for part in fused_parts[fused]] if fused else [source]
            assert torch.equal(param.detach(), torch.cat([tensors[n] for n in names])), name
            used.update(names)

    _, model = build_stage(checkpoint, inspect=backbone_holds_the_checkpoint, **talker_args(native=True))
    assert used == {n for n in tensors if n.startswith(backbone)}
    vendored = {f"tts_model.{k}" for k in model.tts.state_dict()}
    assert vendored == {n for n in talker_names(tensors) if not n.startswith(backbone)}
    tts = model.tts
    tts.set_init_inputs(speaker_name="Aria")
    init = tts.get_init_inputs(B=1)
    with torch.inference_mode():
        prefill = build_prefill_embeds(tts.tts_model, code=init["code"], subword_ids=init["subword_ids"],
                                       subword_mask=init["subword_mask"], audio_mask=init["audio_mask"],
                                       audio_prompt_latent=init.get("audio_prompt_latent"), uncond=False)
    assert prefill.shape == (1, tiny_config.SPEAKER_PROMPT_FRAMES, 64)  # = hf_overrides.talker_init_len
    codes = model._mog_graph.run(torch.randn(1, 1, 64))  # CPU: the captured graph falls back to eager sampling
    assert codes.shape == (1, 1, 31) and 0 <= int(codes.min()) and int(codes.max()) < 64


def test_our_talker_gives_each_session_a_noise_stream_of_its_own(distributed, checkpoint):
    """The in-tree talker samples its MoG head from the process's default generator, so a session's codes depend on
    what else was drawn in between (other sessions' frames); ours swaps each session's own generator state in around
    its draws: a session interleaved with another, with unrelated draws between, gets exactly the codes it gets
    alone, and a session's stream is its seed's (omni/talker)."""
    from vllm_omni_voicechat.omni.talker import ARCHITECTURE, register_architecture
    from vllm_omni_voicechat.omni.talker.model import RNG_KEY, VoiceChatRealtimeTalker, initial_state

    register_architecture()
    _, model = build_stage(checkpoint, **{**talker_args(native=True), "model_arch": ARCHITECTURE})
    assert isinstance(model, VoiceChatRealtimeTalker)
    g = torch.Generator().manual_seed(1)
    hidden_a = [torch.randn(1, 1, 64, generator=g) for _ in range(6)]
    hidden_b = [torch.randn(1, 1, 64, generator=g) for _ in range(6)]

    def session(seed):
        return {RNG_KEY: initial_state(seed, torch.device("cpu"))}

    def sample(s, hidden):
        model._draws.append(s)  # what _native_make_omni_output queues for the row it samples
        return model._mog_graph.run(hidden).reshape(-1).tolist()

    a = session(11)
    alone = [sample(a, h) for h in hidden_a]
    a, b = session(11), session(22)
    together = []
    for ha, hb in zip(hidden_a, hidden_b):
        sample(b, hb)
        torch.rand(7)  # anything else drawing from the process's generator
        together.append(sample(a, ha))
    assert together == alone
    assert [sample(session(12), h) for h in hidden_a] != alone  # another seed, another stream

    # the in-tree talker, for contrast: the same interleaving changes the first session's codes
    graph = model._mog_graph.inner
    torch.manual_seed(5)
    alone = [graph.run(h).reshape(-1).tolist() for h in hidden_a]
    torch.manual_seed(5)
    mixed = []
    for ha, hb in zip(hidden_a, hidden_b):
        graph.run(hb)
        mixed.append(graph.run(ha).reshape(-1).tolist())
    assert mixed != alone


@pytest.mark.parametrize("guided", [False, True], ids=["unguided", "guided"])
def test_our_talker_samples_a_forwards_rows_together_each_on_its_own_stream(distributed, checkpoint, guided):
    """Where no graph is replayed (CPU) our talker MoG-samples a forward's rows in one call (omni/talker/rows.py):
    each row's codes and its session's stream afterwards are exactly those of the row sampled alone (the parent's
    per-row call on the session's stream), so a session's audio does not depend on what shares its forward. Both
    of the parent's sampling configurations: a conditional row each (deployed), and guided [cond; uncond] pairs."""
    from vllm_omni_voicechat.omni.talker import ARCHITECTURE, register_architecture
    from vllm_omni_voicechat.omni.talker.model import initial_state, session_draws
    from vllm_omni_voicechat.omni.talker.rows import RowStreams, sample_rows

    register_architecture()
    _, model = build_stage(checkpoint, **{**talker_args(native=True), "model_arch": ARCHITECTURE})
    tts = model.tts.tts_model
    config = model.tts._get_generation_config(guided)
    assert (config.get("guidance_scale") is not None) == guided
    cpu = torch.device("cpu")
    g = torch.Generator().manual_seed(3)
    seeds = [11, 22, 33, 44]
    frames = [[(torch.randn(1, 1, 64, generator=g), torch.randn(1, 1, 64, generator=g)) for _ in seeds]
              for _ in range(5)]

    def alone(row):
        session = {"vc_rng": initial_state(seeds[row], cpu)}
        out = []
        for frame in frames:
            cond, uncond = frame[row]
            with torch.inference_mode(), session_draws(session, cpu):
                codes, _, _ = tts.generate_step(torch.cat([cond, uncond]) if guided else cond,
                                                ignore_eos_flag_stop=True, **config)
            out.append(codes.reshape(-1).tolist())
        return out, session["vc_rng"]

    solo = [alone(row) for row in range(len(seeds))]
    states = [initial_state(seed, cpu) for seed in seeds]
    together: list[list] = [[] for _ in seeds]
    for frame in frames:
        codes, states = sample_rows(tts, config, [c for c, _ in frame], [u for _, u in frame] if guided else None,
                                    states)
        for row, code in enumerate(codes):
            assert code.shape == (1, 1, 31)
            together[row].append(code.reshape(-1).tolist())
    for row, state in enumerate(states):
        assert together[row] == solo[row][0]
        assert torch.equal(state, solo[row][1])  # the stream goes on where the lone session's would
    assert len({str(codes) for codes in together}) == len(seeds)

    # a draw that is not one per row has no stream to come from: refused, never drawn from a neighbour's
    with pytest.raises(RuntimeError, match="own stream"), RowStreams([torch.Generator()] * 2):
        torch.rand_like(torch.zeros(3, 4))


def test_our_talker_encodes_each_subword_row_once(distributed, checkpoint, monkeypatch):
    """A row of the talker's subword table depends on its token id alone, and a duplex timeline grows by about one
    token a position, mostly text pads: our talker encodes each token once, alone, and keeps the row (bounded)."""
    from vllm_omni_voicechat.omni.talker import ARCHITECTURE, register_architecture
    from vllm_omni_voicechat.omni.talker import model as talker

    register_architecture()
    _, model = build_stage(checkpoint, **{**talker_args(native=True), "model_arch": ARCHITECTURE})
    parent = super(talker.VoiceChatRealtimeTalker, model)._encode_cas_rows
    timeline = torch.tensor([5, 9, 5, 5, 17, 9, 5], dtype=torch.long)
    alone = torch.cat([parent(timeline[i : i + 1]) for i in range(len(timeline))])
    calls = []
    real = talker.NemotronVoiceChatTalkerForConditionalGeneration._encode_cas_rows
    monkeypatch.setattr(talker.NemotronVoiceChatTalkerForConditionalGeneration, "_encode_cas_rows",
                        lambda self, ids: calls.append(ids.tolist()) or real(self, ids))
    assert torch.equal(model._encode_cas_rows(timeline), alone)  # each row what the parent gives that token alone
    assert calls == [[5], [9], [17]]
    assert torch.allclose(model._encode_cas_rows(timeline[:3]), parent(timeline[:3]), atol=1e-6)  # and in a batch
    assert calls == [[5], [9], [17]]  # every row kept

    monkeypatch.setattr(talker, "CAS_ROWS_KEPT", 2)
    model._encode_cas_rows(torch.tensor([23], dtype=torch.long))
    assert list(model._vc_cas_rows) == [5, 23]  # bounded: the least recently used went first


# ---- stage 2: the codec ----------------------------------------------------------------------------------------


def test_code2wav_loads_the_codec_and_decodes_1764_samples_per_frame(distributed, checkpoint, tensors):
    vllm_config, model = build_stage(checkpoint, model_arch="NemotronVoiceChatCode2Wav", model_stage="code2wav",
                                     stage_id=2, hf_config_name="code2wav_config", dtype="float32",
                                     max_model_len=65536, max_num_batched_tokens=65536, skip_tokenizer_init=True,
                                     hf_overrides={"use_incremental_codec_cache": True})
    codec = {f"tts_model.audio_codec.{k}" for k in model.audio_codec.state_dict()}
    assert codec == {n for n in tensors if n.startswith("tts_model.audio_codec.")}
    assert vllm_config.model_config.hf_text_config.hidden_size == tiny_config.CODEC["latent_size"]
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 64, (3, 31), generator=g)
    with torch.inference_mode():
        whole = model(runtime_additional_information=[{"codes": {"audio": codes}}]).multimodal_outputs
        assert whole["model_outputs"][0].shape == (3 * FRAME_OUT,) and int(whole["sr"][0]) == 22050
        for i in range(3):  # duplex: one frame per segment, continuity in the per-request causal-conv cache
            info = {"codes": {"audio": codes[i:i + 1]}, "meta": {"codec_streaming": True, "request_id": "r"}}
            out = model(runtime_additional_information=[info]).multimodal_outputs["model_outputs"][0]
            assert out.shape == (FRAME_OUT,) and torch.isfinite(out).all()


def codec_args(arch: str) -> dict:
    return dict(model_arch=arch, model_stage="code2wav", stage_id=2, hf_config_name="code2wav_config",
                dtype="float32", max_model_len=65536, max_num_batched_tokens=65536, skip_tokenizer_init=True,
                hf_overrides={"use_incremental_codec_cache": True})


def test_our_codec_decodes_a_forwards_sessions_together_as_each_alone(distributed, checkpoint):
    """The in-tree code2wav decodes a forward's duplex sessions one call each; ours stacks their causal-conv caches
    and decodes them in one call (omni/codec): each session's audio and cache afterwards are exactly what its own
    calls give, bit for bit, with sessions joining at different frames (a layer cache some rows lack) and a row the
    parent still takes (a prompt-trimmed chunk) in the same forward."""
    from vllm_omni_voicechat.omni.codec import ARCHITECTURE, register_architecture
    from vllm_omni_voicechat.omni.codec.model import VoiceChatRealtimeCode2Wav

    register_architecture()
    _, model = build_stage(checkpoint, **codec_args(ARCHITECTURE))
    assert isinstance(model, VoiceChatRealtimeCode2Wav)
    g = torch.Generator().manual_seed(4)
    sessions = ["a", "b", "c", "d"]
    joins = {"a": 0, "b": 0, "c": 2, "d": 3}
    codes = {s: torch.randint(0, 64, (6, 31), generator=g) for s in sessions}

    def info(session, frame, key=None):
        return {"codes": {"audio": codes[session][frame:frame + 1]},
                "meta": {"codec_streaming": True, "request_id": key or session, "left_context_size": 0}}

    def decode(infos):
        with torch.inference_mode():
            return model(runtime_additional_information=infos).multimodal_outputs["model_outputs"]

    alone = {s: [decode([info(s, f, key=f"alone-{s}")])[0] for f in range(joins[s], 6)] for s in sessions}
    calls = []
    decode_codec = model.audio_codec.decode
    model.audio_codec.decode = lambda code, *a, **k: calls.append(code.shape[0]) or decode_codec(code, *a, **k)
    together: dict[str, list] = {s: [] for s in sessions}
    trimmed = {"codes": {"audio": codes["a"][:3]}, "meta": {"left_context_size": 1}}
    for frame in range(6):
        here = [s for s in sessions if joins[s] <= frame]
        out = decode([info(s, frame) for s in here] + [trimmed])
        for s, audio in zip(here, out):
            together[s].append(audio)
        assert out[-1].shape == (2 * FRAME_OUT,)  # the parent's prefix re-decode, new frames only
    assert calls == [2, 1, 2, 1, 3, 1, 4, 1, 4, 1, 4, 1]  # the sessions together, then the trimmed row alone
    for s in sessions:
        assert len(together[s]) == len(alone[s])
        for mine, theirs in zip(together[s], alone[s]):
            assert mine.shape == (FRAME_OUT,) and torch.equal(mine, theirs)
        cache, reference = model._stream_caches[s].cache, model._stream_caches[f"alone-{s}"].cache
        assert cache.keys() == reference.keys()
        assert all(torch.equal(cache[layer], reference[layer]) for layer in cache)
    assert len({bytes(together[s][-1].numpy()) for s in sessions}) == len(sessions)
