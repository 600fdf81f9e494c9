"""``VoiceChatRealtimeCode2Wav``: vLLM-Omni 0.30.0's Nemotron VoiceChat code2wav, a forward's sessions decoded in one
codec call.

The parent decodes a forward's requests one at a time (``nemotron_voicechat_code2wav.py``), each duplex session's
new frames through the RVQ-VAE decoder with a causal-convolution cache of its own (``CausalConv1dCache``: per layer,
the last ``kernel - 1`` inputs, batch first). With several sessions in a forward, most of that time is the decoder's
per-call work, not its arithmetic. Here the duplex rows that carry the same number of new frames are decoded
together: their caches stacked layer by layer (a layer a session has not reached yet starts from the zeros the cache
would have made), one decode, each row's audio and cache taken back. Every other row (prompt-trimmed chunks, empty
or terminal ones, the profiler's dummies) goes to the parent unchanged.

A row's audio and cache must not depend on what else was decoded with it. Every layer of the decoder works per row
(convolutions, the channel LayerNorm, the inverse STFT and its overlap-add), but on CPU a transposed convolution
over a batch rounds differently from the same rows alone (one ulp, seen at the first upsampling layer), so the
decoder's transposed convolutions still run a row at a time (they are a small part of a decode); everything else
runs once for all rows, and each row is the same bit for bit as alone (``tests/test_omni_tiny_checkpoint.py``).
[GPU] Elsewhere the rows keep the parent's one call each until a first GPU run shows the same equality
(docs/running-on-gpu.md).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from vllm_omni.model_executor.models.nemotron_voicechat.nemo_vendored.ear_tts_vae_codec import CausalConv1dCache
from vllm_omni.model_executor.models.nemotron_voicechat.nemotron_voicechat_code2wav import (
    NemotronVoiceChatCode2Wav,
    validate_code_stack,
)
from vllm_omni.model_executor.models.nemotron_voicechat.runtime_info import scalar_bool

log = logging.getLogger(__name__)

DECODES_LOG_FORMAT = "voicechat codec decodes by sessions: %s"
"""Logged (cumulative, at most every ``DECODES_LOG_S`` when it changed) like the stage schedulers' forwards."""
DECODES_LOG_S = 2.0

SKIP = {"meta": {"nemotron_voicechat_dummy_profile": True}}
"""What the parent is handed for a row decoded here: its own marker for a row to leave empty."""


def _meta(info: Mapping[str, Any], key: str) -> Any:
    meta = info.get("meta")
    if isinstance(meta, Mapping) and key in meta:
        return meta[key]
    return info.get(f"meta.{key}")


def stack_caches(caches: list[CausalConv1dCache]) -> CausalConv1dCache:
    """One cache whose row ``i`` is ``caches[i]``; a layer only some rows have reached starts at zeros in the
    others (what ``CausalConv1dCache.update`` pads a first step with)."""
    stacked = CausalConv1dCache()
    layers = {layer: None for cache in caches for layer in cache.cache}
    for layer in layers:
        reference = next(cache.cache[layer] for cache in caches if layer in cache.cache)
        stacked.cache[layer] = torch.cat([cache.cache.get(layer, torch.zeros_like(reference)) for cache in caches])
    return stacked


def unstack_cache(stacked: CausalConv1dCache, caches: list[CausalConv1dCache]) -> None:
    """Hand each row of ``stacked`` back to its own cache."""
    for layer, tensor in stacked.cache.items():
        for cache, row in zip(caches, tensor.split(1)):
            cache.cache[layer] = row


def rows_apart(module: nn.Module) -> None:
    """Make ``module`` (of our own model instance) run a batch one row at a time: the same bits as each row alone."""
    inner = module.forward

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if x.shape[0] < 2:
            return inner(x, *args, **kwargs)
        return torch.cat([inner(row, *args, **kwargs) for row in x.split(1)])

    module.forward = forward


class VoiceChatRealtimeCode2Wav(NemotronVoiceChatCode2Wav):
    def _batchable_codec(self) -> nn.Module:
        """The codec, its transposed convolutions made to run a row at a time (once)."""
        codec = self.audio_codec
        if not getattr(codec, "_vc_rows_apart", False):
            for module in codec.modules():
                if isinstance(module, nn.ConvTranspose1d):
                    rows_apart(module)
            codec._vc_rows_apart = True
        return codec

    def _count(self, sessions: int) -> None:
        counts = self.__dict__.setdefault("_vc_decodes", Counter())
        counts[sessions] += 1
        now = time.monotonic()
        if now - self.__dict__.get("_vc_logged_at", float("-inf")) >= DECODES_LOG_S:
            self.__dict__["_vc_logged_at"] = now
            log.info(DECODES_LOG_FORMAT, dict(sorted(counts.items())))

    def _duplex_row(self, info: Any) -> tuple[str, torch.Tensor, int] | None:
        """(cache key, codes as sent, new frames) of a duplex row, or None for any other row. The codes are
        validated only where this class decodes them (the parent validates the rest)."""
        if not isinstance(info, Mapping) or scalar_bool(_meta(info, "nemotron_voicechat_dummy_profile")):
            return None
        key = _meta(info, "request_id")
        if not scalar_bool(_meta(info, "codec_streaming")) or not isinstance(key, str) or not key:
            return None
        codes = self._codes_from_runtime_info(info)
        if codes is None:
            return None
        frames = codes.numel() // self._num_quantizers if codes.dim() == 1 else int(codes.shape[0])
        # As the parent's streaming path: the frames already emitted (``left_context_size``) only tell an empty
        # terminal chunk apart; a duplex chunk's frames are all new.
        emitted = _meta(info, "left_context_size")
        return (key, codes, frames) if frames > max(int(emitted or 0), 0) else None

    def _decode_together(self, infos: list[Any]) -> dict[int, torch.Tensor]:
        """The audio of each row decoded here, by row index."""
        device = next(self.audio_codec.parameters()).device
        groups: dict[int, list[tuple[int, str, torch.Tensor]]] = {}
        for index, info in enumerate(infos):
            row = self._duplex_row(info)
            if row is not None:
                key, codes, frames = row
                groups.setdefault(frames, []).append((index, key, codes))
        audio: dict[int, torch.Tensor] = {}
        for frames, rows in groups.items():
            if len(rows) < 2 or device.type != "cpu":
                for _ in rows:
                    self._count(1)  # the parent's call each
                continue
            self._count(len(rows))
            caches = [self._stream_caches.setdefault(key, CausalConv1dCache()) for _, key, _ in rows]
            cache = stack_caches(caches)
            codes = torch.stack([validate_code_stack(codes, self._num_quantizers, self._codebook_size)
                                 for _, _, codes in rows]).to(device=device)
            lens = torch.full((len(rows),), frames, device=device, dtype=torch.long)
            with torch.autocast(device_type=device.type, enabled=False):  # the codec decodes in fp32
                wav, wav_len = self._batchable_codec().decode(codes, lens, cache=cache)
            unstack_cache(cache, caches)
            for (index, _, _), samples, length in zip(rows, wav, wav_len.tolist()):
                audio[index] = samples.reshape(-1)[:length].detach().to(dtype=torch.float32).cpu()
        return audio

    @torch.no_grad()
    def forward(self, *args: Any, runtime_additional_information: list[dict[str, Any]] | None = None,
                **kwargs: Any) -> Any:
        infos = list(runtime_additional_information or [])
        audio = {} if self.audio_codec is None else self._decode_together(infos)
        if not audio:
            return super().forward(*args, runtime_additional_information=runtime_additional_information, **kwargs)
        rest = [SKIP if index in audio else info for index, info in enumerate(infos)]
        output = super().forward(*args, runtime_additional_information=rest, **kwargs)
        outputs = output.multimodal_outputs["model_outputs"]
        for index, samples in audio.items():
            outputs[index] = samples
        return output


__all__ = ["VoiceChatRealtimeCode2Wav", "rows_apart", "stack_caches", "unstack_cache"]
