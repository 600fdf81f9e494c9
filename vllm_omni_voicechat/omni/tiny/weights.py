"""The tiny checkpoint's tensors, under the unified ``model.safetensors`` names of the real checkpoint, per stage.

Names and shapes mirror the modules vLLM-Omni 0.30's loaders build from ``config.py`` (the tests load every stage
through them and require an exact match). Everything is float32, like the real file (44 GB of F32); the loaders
cast (thinker bf16, talker/codec fp32). Persistent buffers are written too: the real file holds them (the talker
loader reports any missing one), and a few must equal what the module computes at construction (mel filterbank,
tokenizer-derived flags), which is what this module computes as well.

Initialisation keeps a random network numerically tame (fan-in scaled matrices, unit or zero norms the way each
norm applies its weight), so a forward stays finite; it carries no other meaning.
"""

from __future__ import annotations

import math

import torch

from . import config as C
from .vocab import BOS, EOS, RNNT_VOCAB, TEXT_VOCAB, text_token_list

Tensors = dict[str, torch.Tensor]


class _Init:
    """Deterministic draws from one seeded generator, in call order."""

    def __init__(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)

    def normal(self, *shape: int, std: float | None = None) -> torch.Tensor:
        if std is None:  # fan-in scaling for matrices / conv kernels, unit for vectors
            std = 1.0 / math.sqrt(math.prod(shape[1:])) if len(shape) > 1 else 1.0
        return torch.randn(*shape, generator=self.gen) * std

    def uniform(self, *shape: int, bound: float) -> torch.Tensor:
        return (torch.rand(*shape, generator=self.gen) * 2 - 1) * bound


def _ones(*shape: int) -> torch.Tensor:
    return torch.ones(*shape)


def _zeros(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape)


# ---- thinker -------------------------------------------------------------------------------------------------------


def slaney_mel_filterbank(n_fft: int, n_mels: int, sample_rate: int) -> torch.Tensor:
    """[1, n_mels, n_fft // 2 + 1] Slaney-scale, area-normalised triangles (librosa's default mel filterbank,
    which NeMo's featurizer computes at construction and the checkpoint stores)."""

    def hz_to_mel(hz: torch.Tensor) -> torch.Tensor:
        linear = hz * 3.0 / 200.0
        log = 15.0 + torch.log(torch.clamp(hz, min=1e-10) / 1000.0) * 27.0 / math.log(6.4)
        return torch.where(hz >= 1000.0, log, linear)

    def mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
        linear = mel * 200.0 / 3.0
        log = 1000.0 * torch.exp((mel - 15.0) * math.log(6.4) / 27.0)
        return torch.where(mel >= 15.0, log, linear)

    freqs = torch.linspace(0, sample_rate // 2, n_fft // 2 + 1, dtype=torch.float64)
    edges = mel_to_hz(torch.linspace(0.0, float(hz_to_mel(torch.tensor(sample_rate / 2.0, dtype=torch.float64))),
                                     n_mels + 2, dtype=torch.float64))
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (freqs[None, :] - lower) / (centre - lower)
    falling = (upper - freqs[None, :]) / (upper - centre)
    triangles = torch.clamp(torch.minimum(rising, falling), min=0.0)
    return (triangles * (2.0 / (upper - lower))).to(torch.float32).unsqueeze(0)


def _conv_out(length: int, *, causal: bool, kernel: int = 3, stride: int = 2, repeat: int = 3) -> int:
    pad = (kernel - 1) + (stride - 1) if causal else 2 * (kernel // 2)
    for _ in range(repeat):
        length = (length + pad - kernel) // stride + 1
    return length


def perception(r: _Init) -> Tensors:
    pre, enc = C.PERCEPTION["preprocessor"], C.PERCEPTION["encoder"]
    d, ch, heads = enc["d_model"], enc["subsampling_conv_channels"], enc["n_heads"]
    win = int(pre["window_size"] * pre["sample_rate"])
    t: Tensors = {
        "preprocessor.featurizer.window": torch.hann_window(win, periodic=False),
        "preprocessor.featurizer.fb": slaney_mel_filterbank(pre["n_fft"], pre["features"], pre["sample_rate"]),
    }
    freq = _conv_out(enc["feat_in"], causal=enc["causal_downsampling"])
    t["encoder.pre_encode.out.weight"] = r.normal(d, ch * freq)
    t["encoder.pre_encode.out.bias"] = _zeros(d)
    # dw_striding x8: a full conv, then (depthwise, pointwise) pairs; ReLUs sit at indices 1, 4.
    t["encoder.pre_encode.conv.0.weight"], t["encoder.pre_encode.conv.0.bias"] = r.normal(ch, 1, 3, 3), _zeros(ch)
    for dw, pw in ((2, 3), (5, 6)):
        t[f"encoder.pre_encode.conv.{dw}.weight"], t[f"encoder.pre_encode.conv.{dw}.bias"] = \
            r.normal(ch, 1, 3, 3), _zeros(ch)
        t[f"encoder.pre_encode.conv.{pw}.weight"], t[f"encoder.pre_encode.conv.{pw}.bias"] = \
            r.normal(ch, ch, 1, 1), _zeros(ch)
    ff = d * enc["ff_expansion_factor"]
    for i in range(enc["n_layers"]):
        p = f"encoder.layers.{i}."
        for norm in ("norm_feed_forward1", "norm_conv", "norm_self_att", "norm_feed_forward2", "norm_out",
                     "conv.batch_norm"):  # conv_norm_type layer_norm keeps NeMo's "batch_norm" name
            t[p + norm + ".weight"], t[p + norm + ".bias"] = _ones(d), _zeros(d)
        for ffn in ("feed_forward1", "feed_forward2"):
            t[p + ffn + ".linear1.weight"], t[p + ffn + ".linear1.bias"] = r.normal(ff, d), _zeros(ff)
            t[p + ffn + ".linear2.weight"], t[p + ffn + ".linear2.bias"] = r.normal(d, ff), _zeros(d)
        t[p + "conv.pointwise_conv1.weight"], t[p + "conv.pointwise_conv1.bias"] = r.normal(2 * d, d, 1), _zeros(2 * d)
        t[p + "conv.depthwise_conv.weight"] = r.normal(d, 1, enc["conv_kernel_size"])
        t[p + "conv.depthwise_conv.bias"] = _zeros(d)
        t[p + "conv.pointwise_conv2.weight"], t[p + "conv.pointwise_conv2.bias"] = r.normal(d, d, 1), _zeros(d)
        t[p + "self_attn.pos_bias_u"] = r.normal(heads, d // heads, std=0.02)
        t[p + "self_attn.pos_bias_v"] = r.normal(heads, d // heads, std=0.02)
        for lin in ("linear_q", "linear_k", "linear_v", "linear_out"):
            t[p + f"self_attn.{lin}.weight"], t[p + f"self_attn.{lin}.bias"] = r.normal(d, d), _zeros(d)
        t[p + "self_attn.linear_pos.weight"] = r.normal(d, d)
    t["proj.weight"] = r.normal(C.PERCEPTION["output_dim"], d)
    t["proj.bias"] = _zeros(C.PERCEPTION["output_dim"])
    return t


def nemotron_h(r: _Init) -> Tensors:
    """``stt_model.llm.*``: NemotronH's backbone without its embedding (the checkpoint keeps one shared
    ``stt_model.embed_tokens``; the thinker fills ``backbone.embeddings`` from it)."""
    cfg = C.llm_config()
    h, heads, hd = cfg["hidden_size"], cfg["mamba_num_heads"], cfg["mamba_head_dim"]
    inner, groups, state = heads * hd, cfg["n_groups"], cfg["ssm_state_size"]
    conv_dim = inner + 2 * groups * state
    t: Tensors = {}
    for i, kind in enumerate(cfg["hybrid_override_pattern"]):
        p = f"layers.{i}."
        t[p + "norm.weight"] = _ones(h)
        if kind == "M":
            t[p + "mixer.in_proj.weight"] = r.normal(2 * inner + 2 * groups * state + heads, h)
            t[p + "mixer.conv1d.weight"] = r.normal(conv_dim, 1, cfg["conv_kernel"])
            t[p + "mixer.conv1d.bias"] = _zeros(conv_dim)
            dt = torch.exp(torch.linspace(math.log(cfg["time_step_min"]), math.log(cfg["time_step_max"]), heads))
            t[p + "mixer.dt_bias"] = dt + torch.log(-torch.expm1(-dt))  # softplus^-1: softplus(dt_bias) = dt
            t[p + "mixer.A_log"] = torch.log(torch.arange(1, heads + 1, dtype=torch.float32))
            t[p + "mixer.D"] = _ones(heads)
            t[p + "mixer.norm.weight"] = _ones(inner)
            t[p + "mixer.out_proj.weight"] = r.normal(h, inner)
        elif kind == "*":
            q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
            t[p + "mixer.q_proj.weight"] = r.normal(q, h)
            t[p + "mixer.k_proj.weight"] = r.normal(kv, h)
            t[p + "mixer.v_proj.weight"] = r.normal(kv, h)
            t[p + "mixer.o_proj.weight"] = r.normal(h, q)
        elif kind == "-":
            t[p + "mixer.up_proj.weight"] = r.normal(cfg["intermediate_size"], h)
            t[p + "mixer.down_proj.weight"] = r.normal(h, cfg["intermediate_size"])
        else:
            raise AssertionError(f"layer kind {kind!r}")
    t["norm_f.weight"] = _ones(h)
    return t


def rnnt(r: _Init) -> Tensors:
    """NeMo's RNNT decoder + joint under ``stt_model.rnnt_decoder`` / ``stt_model.rnnt_joint`` (the prefix a
    reader of the real header reports; ``omni/thinker/checkpoint.py`` maps any ``rnnt*`` prefix)."""
    pred, joint, enc = C.RNNT["pred_hidden"], C.RNNT["joint_hidden"], C.PERCEPTION["encoder"]["d_model"]
    bound = 1.0 / math.sqrt(pred)
    t: Tensors = {"rnnt_decoder.prediction.embed.weight": r.normal(RNNT_VOCAB + 1, pred, std=1.0)}
    for layer in range(C.RNNT["pred_rnn_layers"]):
        for kind in ("ih", "hh"):
            t[f"rnnt_decoder.prediction.dec_rnn.lstm.weight_{kind}_l{layer}"] = r.uniform(4 * pred, pred, bound=bound)
        for kind in ("ih", "hh"):
            t[f"rnnt_decoder.prediction.dec_rnn.lstm.bias_{kind}_l{layer}"] = r.uniform(4 * pred, bound=bound)
    t["rnnt_joint.enc.weight"], t["rnnt_joint.enc.bias"] = r.normal(joint, enc), _zeros(joint)
    t["rnnt_joint.pred.weight"], t["rnnt_joint.pred.bias"] = r.normal(joint, pred), _zeros(joint)
    # joint_net = (ReLU, Dropout, Linear): the Linear is index 2.
    t["rnnt_joint.joint_net.2.weight"] = r.normal(RNNT_VOCAB + 1, joint)
    t["rnnt_joint.joint_net.2.bias"] = _zeros(RNNT_VOCAB + 1)
    return t


def thinker(r: _Init) -> Tensors:
    h = C.LLM_HIDDEN
    t: Tensors = {}
    t.update({f"stt_model.perception.{k}": v for k, v in perception(r).items()})
    t.update({f"stt_model.llm.{k}": v for k, v in nemotron_h(r).items()})
    t["stt_model.embed_tokens.weight"] = r.normal(TEXT_VOCAB, h, std=1.0)
    t["stt_model.lm_head.weight"] = r.normal(TEXT_VOCAB, h)
    t["stt_model.function_head.weight"] = r.normal(TEXT_VOCAB, h)
    t.update({f"stt_model.{k}": v for k, v in rnnt(r).items()})
    return t


# ---- talker + codec --------------------------------------------------------------------------------------------------


def codec(r: _Init) -> Tensors:
    """``RVQVAEModel``: Wav2Latent encoder, the probabilistic RVQ codebooks, Latent2Wav decoder."""
    c = C.CODEC
    base, latent, mult, k = c["base_hidden_size"], c["latent_size"], c["channel_mult"], c["kernel_size"]
    t: Tensors = {}

    def convnext(p: str, dim: int) -> None:
        t[p + "dwconv.weight"], t[p + "dwconv.bias"] = r.normal(dim, 1, k), _zeros(dim)
        t[p + "norm.weight"], t[p + "norm.bias"] = _ones(dim), _zeros(dim)
        t[p + "pwconv1.weight"], t[p + "pwconv1.bias"] = r.normal(4 * dim, dim, 1), _zeros(4 * dim)
        t[p + "pwconv2.weight"], t[p + "pwconv2.bias"] = r.normal(dim, 4 * dim, 1), _zeros(dim)

    # Encoder: 1x1 in, then per stage num_blocks ConvNeXt + a strided conv (to the next width, the last to latent).
    idx = 0
    t[f"encoder.layers.{idx}.weight"] = r.normal(base * mult[0], c["n_fft"] + 2, 1)
    for stage, (m, rate) in enumerate(zip(mult, c["rates"])):
        for _ in range(c["num_blocks"]):
            idx += 1
            convnext(f"encoder.layers.{idx}.", base * m)
        idx += 1
        nxt = base * mult[stage + 1] if stage + 1 < len(mult) else latent
        t[f"encoder.layers.{idx}.weight"] = r.normal(nxt, base * m, rate)
    for i in range(c["num_quantizers"]):
        mus = torch.nn.functional.normalize(r.normal(c["codebook_size"], latent, std=1.0), dim=1)
        t[f"prvq.mus_list.{i}"] = mus * ((c["num_quantizers"] - i) / c["num_quantizers"])
    for i in range(c["num_quantizers"]):
        t[f"prvq._variance_list.{i}.variance"] = torch.tensor(1.0)
    # Decoder: reversed stages, each a transposed conv (ConvTranspose weight is [in, out, k]) then ConvNeXt blocks.
    idx = -1
    rev_mult, rev_rates = list(reversed(mult)), list(reversed(c["rates"]))
    for stage, (m, rate) in enumerate(zip(rev_mult, rev_rates)):
        idx += 1
        src = base * rev_mult[stage - 1] if stage else latent
        t[f"decoder.layers.{idx}.weight"] = r.normal(src, base * m, rate, std=1.0 / math.sqrt(src))
        for _ in range(c["num_blocks"]):
            idx += 1
            convnext(f"decoder.layers.{idx}.", base * m)
    idx += 1
    t[f"decoder.layers.{idx}.weight"] = r.normal(c["n_fft"] + 2, base * rev_mult[-1], 1)
    return t


def _tokenizer_flags() -> Tensors:
    """The CAS encoder's tokenizer-derived buffers, as ``SubwordFlagEmbedding`` / ``BOSEOSEmbedding`` compute them
    from the text tokenizer (a mismatch would make the talker loader fall back to a partial load)."""
    tokens, _, _ = text_token_list()
    cont = [0 if tok.startswith(("\u0120", "\u2581", "<")) else 1 for tok in tokens] + [0]
    last = len(tokens) - 1  # BOSEOSEmbedding sizes by the largest id and flags ids below it
    flags = [1 if tok == BOS else 2 if tok == EOS else 0 for tok in tokens[:last]] + [0]
    p = "tts_model.embed_subword."
    return {
        p + "subword_flag_emb.pad_tensor": torch.tensor(len(tokens), dtype=torch.int64),
        p + "subword_flag_emb.is_continuation": torch.tensor(cont, dtype=torch.int64),
        p + "bos_eos_emb.pad_tensor": torch.tensor(last, dtype=torch.int64),
        p + "bos_eos_emb.special_flags": torch.tensor(flags, dtype=torch.int64),
    }


def _gemma_layers(r: _Init, prefix: str, cfg: dict, norms: tuple[str, ...], qk_norm: bool) -> Tensors:
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    q, kv, ff = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd, cfg["intermediate_size"]
    t: Tensors = {}
    for i in range(cfg["num_hidden_layers"]):
        p = f"{prefix}layers.{i}."
        t[p + "self_attn.q_proj.weight"] = r.normal(q, h)
        t[p + "self_attn.k_proj.weight"] = r.normal(kv, h)
        t[p + "self_attn.v_proj.weight"] = r.normal(kv, h)
        t[p + "self_attn.o_proj.weight"] = r.normal(h, q)
        if qk_norm:
            t[p + "self_attn.q_norm.weight"], t[p + "self_attn.k_norm.weight"] = _zeros(hd), _zeros(hd)
        t[p + "mlp.gate_proj.weight"] = r.normal(ff, h)
        t[p + "mlp.up_proj.weight"] = r.normal(ff, h)
        t[p + "mlp.down_proj.weight"] = r.normal(h, ff)
        for norm in norms:  # Gemma norms scale by (1 + weight): zero is the identity
            t[p + norm + ".weight"] = _zeros(h)
    t[prefix + "norm.weight"] = _zeros(h)
    return t


def talker(r: _Init) -> Tensors:
    """``tts_model.*`` (the whole ``DuplexEARTTS`` state) minus the codec, plus the pre-baked speaker latent."""
    codec_cfg = C.CODEC
    h, latent, q = C.TALKER_BACKBONE["hidden_size"], codec_cfg["latent_size"], codec_cfg["num_quantizers"]
    mog, cas = C.MOG_HEAD, C.CAS_ENCODER
    p = "tts_model.tts_model."
    t: Tensors = {
        "tts_model.codec_silence_tokens": torch.zeros(q, dtype=torch.int64),
        "tts_model._control_codes": torch.tensor([codec_cfg["codebook_size"] + d for d in (2, 1, 0)],
                                                 dtype=torch.int64),  # speech BOS, EOS, PAD ids
        p + "bos_emb": r.normal(h, std=1.0),
        p + "null_emb": r.normal(h, std=1.0),
    }
    # The frozen prompt projection, the module's own recipe (U diag(s) V^T, s in [0.4, 2.5]); float64 so the
    # float32 result does not hang on the LAPACK build.
    u, _ = torch.linalg.qr(r.normal(h, h, std=1.0).double())
    v, _ = torch.linalg.qr(r.normal(h, h, std=1.0).double())
    s = 0.4 + 2.1 * torch.rand(h, generator=r.gen).double()
    t[p + "audio_prompt_projection_W"] = (u @ torch.diag(s) @ v.T).float()
    t[p + "rvq_embs"] = torch.empty(0)  # all_tensors binds the codec's codebooks here, as the module does
    t.update(_gemma_layers(r, p + "backbone.", C.TALKER_BACKBONE,
                           ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                            "post_feedforward_layernorm"), qk_norm=True))
    t[p + "embed_code.weight"] = r.normal(h, latent)
    sub = p + "embed_subword."
    t.update(_gemma_layers(r, sub + "backbone.encoder.", cas,
                           ("pre_self_attn_layernorm", "post_self_attn_layernorm", "pre_feedforward_layernorm",
                            "post_feedforward_layernorm"), qk_norm=False))
    n_chars = sum(len(tok) == 1 for tok in text_token_list()[0]) + 1  # single-character tokens + the char pad
    t[sub + "embed_tokens.weight"] = r.normal(n_chars, cas["hidden_size"], std=1.0)
    t[sub + "proj_embedding.weight"] = r.normal(h, cas["hidden_size"])
    cont = r.normal(2, cas["hidden_size"], std=cas["hidden_size"] ** -0.5)
    cont[0] = 0.0
    t[sub + "subword_flag_emb.cont_emb.weight"] = cont
    special = r.normal(3, cas["hidden_size"], std=cas["hidden_size"] ** -0.5)
    special[0] = 0.0
    t[sub + "bos_eos_emb.special_emb.weight"] = special
    t.update({k.replace("tts_model.embed_subword.", sub): v for k, v in _tokenizer_flags().items()})
    g = p + "gated_fusion_audio_text."
    t[g + "gate"], t[g + "residual_scale"] = _zeros(h), torch.tensor(0.5)
    t[g + "audio_proj.weight"], t[g + "audio_proj.bias"] = r.normal(h, h, std=0.015), _zeros(h)
    t[g + "text_proj.weight"], t[g + "text_proj.bias"] = r.normal(h, h, std=0.015), _zeros(h)
    t[g + "final_norm.weight"] = _zeros(h)
    m = p + "mog_head."
    n, rank = mog["num_predictions"], mog["low_rank"]
    t[m + "low_mat"] = r.normal(n, latent, rank, std=rank ** -0.5)
    for i in range(mog["num_layers"]):
        t[m + f"mlp_stack.{i}.pre_norm.weight"] = _zeros(h)
        t[m + f"mlp_stack.{i}.mlp.gate_proj.weight"] = r.normal(mog["intermediate_size"], h)
        t[m + f"mlp_stack.{i}.mlp.up_proj.weight"] = r.normal(mog["intermediate_size"], h)
        t[m + f"mlp_stack.{i}.mlp.down_proj.weight"] = r.normal(h, mog["intermediate_size"])
        t[m + f"mlp_stack.{i}.post_norm.weight"] = _zeros(h)
    t[m + f"mlp_stack.{mog['num_layers']}.weight"] = _zeros(h)
    t[m + "proj_logits.weight"] = r.normal(n, h)
    t[m + "proj_mus.weight"] = r.normal(n * rank, h)
    t[m + "proj_logs.weight"] = r.normal(1, h, std=0.02)
    t[m + "proj_else.weight"] = r.normal(latent, h)
    # The speaker prompt latent replaces the prompt-region code embeddings: [1, prompt frames, hidden].
    t["tts_model.audio_prompt_latents." + C.SPEAKER] = r.normal(1, C.SPEAKER_PROMPT_FRAMES, h, std=1.0)
    return t


def all_tensors(seed: int, scripted: bool = True) -> dict[str, Tensors]:
    """Per stage: ``thinker`` (stt_model.*), ``talker`` (tts_model.* but the codec), ``codec``
    (tts_model.audio_codec.*: read by the code2wav and the talker alike). ``scripted``: arranged to follow
    ``script.py`` (listen, answer, call a tool); otherwise plain random."""
    r = _Init(seed)
    stages: dict[str, Tensors] = {"thinker": thinker(r)}
    talker_tensors = talker(r)
    codec_tensors = {f"tts_model.audio_codec.{k}": v for k, v in codec(r).items()}
    talker_tensors["tts_model.tts_model.rvq_embs"] = torch.stack(
        [codec_tensors[f"tts_model.audio_codec.prvq.mus_list.{i}"] for i in range(C.CODEC["num_quantizers"])])
    stages["talker"] = talker_tensors
    stages["codec"] = codec_tensors
    if scripted:
        from . import script

        script.apply(stages)
    for tensors in stages.values():
        for name, tensor in tensors.items():
            tensors[name] = tensor.contiguous() if tensor.dtype == torch.int64 else tensor.float().contiguous()
    return stages

