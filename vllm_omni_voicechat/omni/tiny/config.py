"""The tiny checkpoint's ``config.json`` (NeMo layout: ``model.stt.model`` / ``model.speech_generation.model``, as
``NemotronVoiceChatConfig`` parses it) and the NemotronH backbone config its ``pretrained_llm`` points at.

Every size lives here; ``weights.py`` derives the tensor shapes from these dicts. Why each size:

* head dims the CPU attention kernel takes (32, 64, 80, ...; vllm/v1/attention/backends/cpu_attn.py): the
  NemotronH attention uses 32, the talker's Gemma3 64 (the real 72 is not supported on CPU).
* the talker's latent / MoG low rank are powers of two (``MoGHead.infer`` asserts it).
* the codec keeps 31 quantizers and 1,764 samples per code frame (hop 42 x rates 6 x 7): code2wav, the talker's
  speaker prompt (3 s -> 37 frames, ``talker_init_len``) and the 80 ms clock depend on them; only the codebook
  (64) and the widths are small.
* the perception keeps the real streaming geometry (128 mel, x8 causal dw-striding, att_context [70, 0]) so one
  80 ms frame gives exactly one embedding; only its width and depth are small.
"""

from __future__ import annotations

from typing import Any

from .vocab import BOS, EOS, PAD, TEXT_VOCAB

LLM_HIDDEN = 64
SAMPLES_PER_CODE_FRAME = 1764  # 22,050 Hz x 80 ms
SPEAKER = "Aria"
SPEAKER_PROMPT_FRAMES = 37  # talker_init_len: (3 s of 22.05 kHz // 1,764) = 37 prompt frames (+ EOS slot - 1)
LLM_ID = "nvidia/NVIDIA-Nemotron-Nano-9B-v2"

# ---- the thinker -----------------------------------------------------------------------------------------------

PERCEPTION = {
    "_target_": "nemo.collections.speechlm2.modules.perception.AudioPerceptionModule",
    "preprocessor": {
        "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
        "sample_rate": 16000, "normalize": "NA", "window_size": 0.025, "window_stride": 0.01, "window": "hann",
        "features": 128, "n_fft": 512, "log": True, "frame_splicing": 1, "dither": 1.0e-05, "pad_to": 0,
        "pad_value": 0.0,
    },
    "encoder": {
        "_target_": "nemo.collections.asr.modules.ConformerEncoder",
        "feat_in": 128, "feat_out": -1, "n_layers": 2, "d_model": 32, "n_heads": 4,
        "subsampling": "dw_striding", "subsampling_factor": 8, "subsampling_conv_channels": 16,
        "causal_downsampling": True, "ff_expansion_factor": 4, "self_attention_model": "rel_pos",
        "att_context_size": [70, 0], "att_context_style": "chunked_limited", "xscaling": True,
        "untie_biases": True, "pos_emb_max_len": 5000, "conv_kernel_size": 9, "conv_norm_type": "layer_norm",
        "conv_context_size": "causal", "dropout": 0.0, "dropout_pre_encoder": 0.0, "dropout_emb": 0.0,
        "dropout_att": 0.0,
    },
    "modality_adapter": {"_target_": "nemo.collections.speechlm2.modules.perception.IdentityConnector",
                         "d_model": 32},
    "output_dim": LLM_HIDDEN,
}

RNNT = {"pred_hidden": 32, "pred_rnn_layers": 2, "joint_hidden": 32}  # the joint reads the encoder's d_model


def llm_config() -> dict[str, Any]:
    """NemotronH (``config.json`` of the ``pretrained_llm`` folder), the feasibility study's shape (cpu-engine.md)."""
    return {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "vocab_size": TEXT_VOCAB,
        "hidden_size": LLM_HIDDEN,
        "hybrid_override_pattern": "M*-M-",
        "num_hidden_layers": 5,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 128,
        "mlp_hidden_act": "relu2",
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "ssm_state_size": 16,
        "n_groups": 1,
        "conv_kernel": 4,
        "expand": 2,
        "chunk_size": 128,
        "mamba_hidden_act": "silu",
        "use_conv_bias": True,
        "mamba_proj_bias": False,
        "attention_bias": False,
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-05,
        "residual_in_fp32": False,
        "rescale_prenorm_residual": True,
        "time_step_min": 0.001,
        "time_step_max": 0.1,
        "time_step_floor": 0.0001,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": 1,
        "eos_token_id": 12,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
    }


# ---- the talker and the codec ------------------------------------------------------------------------------------

CODEC = {
    "latent_size": 32, "n_fft": 84, "hop_length": 42, "base_hidden_size": 8, "channel_mult": [1, 2],
    "rates": [6, 7], "num_blocks": 1, "kernel_size": 7, "groups": 1, "codebook_size": 64, "num_quantizers": 31,
    "wav_to_token_ratio": SAMPLES_PER_CODE_FRAME,
}

TALKER_BACKBONE = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 64, "sliding_window": 1500,
    "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "attention_dropout": 0.0,
    "use_cache": False,
}

# The character-aware subword encoder: its width must equal the talker's (its flag embeddings are added after the
# projection to the talker width), as in the real model (1152 both).
CAS_ENCODER = {
    "hidden_size": TALKER_BACKBONE["hidden_size"], "intermediate_size": 128, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32, "attention_dropout": 0.0, "use_cache": False,
}

MOG_HEAD = {"intermediate_size": 128, "num_layers": 1, "low_rank": 16, "num_predictions": 32, "min_log_std": -4.0,
            "eps": 1e-06}


def tts_config() -> dict[str, Any]:
    return {
        "use_gated_fusion_for_text_audio": True,
        "disable_eos_prediction": True,
        "use_bos_eos_emb": True,
        "use_subword_flag_emb": True,
        "use_audio_prompt_frozen_projection": True,
        "num_delay_speech_tokens": 2,
        "backbone_type": "gemma3_text",
        "backbone_model_class": None,
        "backbone_config_class": None,
        "backbone_config": dict(TALKER_BACKBONE),
        "latent_size": CODEC["latent_size"],
        "codebook_size": CODEC["codebook_size"],
        "num_quantizers": CODEC["num_quantizers"],
        "context_hidden_size": None,
        "cas_config": {
            "backbone_type": "t5gemma",
            "backbone_model_class": None,
            "backbone_config_class": None,
            "backbone_config": {"is_encoder_decoder": False, "encoder": dict(CAS_ENCODER)},
        },
        "mog_head_config": dict(MOG_HEAD),
        "p_uncond": 0.1,
        "label_smoothing": 0.01,
        "max_training_rate": 0.8,
        "quantizer_dropout": 0.5,
        "random_target_masking": False,
        "exponent": 3.0,
    }


def checkpoint_config(llm_ref: str) -> dict[str, Any]:
    """The unified ``config.json``. ``llm_ref`` is what ``pretrained_llm`` / ``pretrained_lm_name`` name: the
    backbone config and the text tokenizer folder."""
    data = {"frame_length": 0.08, "source_sample_rate": 16000, "target_sample_rate": 22050,
            "input_roles": ["user", "User"], "output_roles": ["agent", "Assistant", "assistant", "Agent"]}
    stt = {
        "pretrained_llm": llm_ref,
        "pretrained_weights": False,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "predict_user_text": False,
        "use_function_head": True,
        "duplex_user_channel_weight": 1.0,
        "duplex_text_channel_weight": 1.0,
        "duplex_function_channel_weight": 2.0,
        "source_sample_rate": 16000,
        "perception": PERCEPTION,
    }
    speech_generation = {
        "pretrained_lm_name": llm_ref,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "audio_codec_run_dtype": "float32",
        "inference_guidance_enabled": True,
        "inference_guidance_scale": 0.2,
        "inference_noise_scale": 0.8,
        "inference_top_p_or_k": 0.8,
        "inference_force_speech_silence_on_eos": True,
        "codec_config": dict(CODEC),
        "tts_config": tts_config(),
    }
    tts_data = {"add_text_bos_and_eos_in_each_turn": True, "add_audio_prompt": True, "audio_prompt_duration": 3.0,
                "frame_length": 0.08, "source_sample_rate": 16000, "target_sample_rate": 22050}
    return {
        "model": {
            "inference_speaker_name": SPEAKER,
            "stt": {"model": stt, "data": {"source_sample_rate": 16000}},
            "speech_generation": {"model": speech_generation, "data": tts_data},
        },
        "data": data,
    }
