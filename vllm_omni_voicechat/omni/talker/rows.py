"""One talker forward's rows MoG-sampled together, each row's noise drawn from its own session's stream.

vLLM-Omni samples a forward's rows one at a time (``_native_make_omni_output`` calls its MoG step per row). On a
GPU each call replays a captured graph; where there is none (CPU) each is ~1,600 small eager ops, and at four
sessions that loop was 40 % of Stage 1's CPU. ``sample_rows`` runs the step's unmasking loop once for all rows.
A row's noise must still come from its own session's stream (a session's audio may not depend on what shares its
forward): the Gaussian noise is drawn here per row, and the MoG head's Gumbel draw (``torch.rand_like`` inside
``MoGHead.infer``) is served row by row by ``RowStreams``, PyTorch's documented way to intercept a torch function
(``TorchFunctionMode``), active around the head's ~20 ops of an iteration only. Row ``i`` draws with its own shape
from generator ``i``: exactly what that session's lone step draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from vllm_omni.model_executor.models.nemotron_voicechat.nemo_vendored.ear_tts_model import (
    depthsum_encoding_step,
)

_DRAWS = {torch.rand_like: torch.rand, torch.randn_like: torch.randn}


class RowStreams(TorchFunctionMode):
    """Inside it, ``rand_like`` / ``randn_like`` of a [rows, ...] tensor draw row ``i`` from ``generators[i]``."""

    def __init__(self, generators: Sequence[torch.Generator]) -> None:
        super().__init__()
        self.generators = list(generators)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        draw = _DRAWS.get(func)
        if draw is None:
            return func(*args, **kwargs)
        like: torch.Tensor = args[0]
        if like.dim() == 0 or like.shape[0] != len(self.generators):
            raise RuntimeError(f"talker rows: a draw shaped {tuple(like.shape)} in a batch of "
                               f"{len(self.generators)} rows (each row needs its own stream)")
        dtype = kwargs.get("dtype") or like.dtype
        device = kwargs.get("device") or like.device
        shape = (1, *like.shape[1:])
        return torch.cat([draw(shape, generator=g, dtype=dtype, device=device) for g in self.generators])


def _per_iteration(value: Any, count: int) -> list | None:
    if value is None:
        return None
    return list(value) if isinstance(value, list) else [value] * count


def sample_rows(model: Any, generation_config: dict[str, Any], conditional: Sequence[torch.Tensor],
                unconditional: Sequence[torch.Tensor] | None, states: Sequence[torch.Tensor]
                ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """MoG-sample one code row per session: ``conditional[i]`` (and under guidance ``unconditional[i]``) are its
    hidden rows, ``states[i]`` its generator state. Returns each row's codes ([1, 1, Q], what the parent's per-row
    ``generate_step`` gives for it) and each session's generator state after its draws.

    The unmasking loop of ``RVQEARTTSModel.generate_step`` (its ``ignore_eos_flag_stop`` form: the codes never read
    its EOS head, so that head is not run), on the model's own parts: its unmasking schedule, code embeddings, MoG
    head and residual quantizer. Only the head runs under ``RowStreams`` (~20 ops an iteration: a mode around all
    ~1,600 ops of a step cost ~10 ms, almost half of what sampling four rows at once saved); the Gaussian noise is
    drawn here, per row.
    ``tests/test_omni_tiny_checkpoint.py`` holds it equal to the parent's per-row step, row by row."""
    generators = []
    for state in states:
        generator = torch.Generator(device=conditional[0].device)
        generator.set_state(state)
        generators.append(generator)
    hidden = torch.cat([row.reshape(1, 1, -1) for row in conditional])
    uncond = torch.cat([row.reshape(1, 1, -1) for row in unconditional]) if unconditional else None
    num_iter = int(generation_config["num_iter"])
    guidance = _per_iteration(generation_config.get("guidance_scale"), 1 + num_iter)
    top_p_or_k = _per_iteration(generation_config.get("top_p_or_k"), 1 + num_iter)
    noise_scale = _per_iteration(generation_config.get("noise_scale"), num_iter)
    exponent = generation_config.get("exponent")
    exponent = model.config.exponent if exponent is None else exponent
    with torch.inference_mode():
        code = torch.full((len(states), 1, int(model.config.num_quantizers)), int(model.config.codebook_size),
                          dtype=torch.long, device=hidden.device)
        levels = model.rvq_embs
        # The code's depth-sum embedding, kept as levels are set: the parent's ``depthsum_embedding`` re-adds all 31
        # levels every iteration in level order, the still-masked ones as exact zeros, so the running sum in the
        # same order is the same value for an eighth of the lookups.
        depthsum = torch.zeros((len(states), 1, levels.shape[-1]), device=hidden.device)
        done = 0
        for i, count in enumerate(model._unmask_schedule(num_iter, float(exponent))):
            if count == 0:
                continue
            embeds = model.embed_code(depthsum.to(model.embed_code.weight.dtype))
            if model.config.random_target_masking:
                embeds = embeds + model.embed_target_mask(torch.tensor(done + count - 1, device=hidden.device))
            scale = guidance[i] if guidance is not None else 0.0
            embeds = torch.cat([embeds + hidden, embeds + uncond]) if scale > 0.0 else embeds + hidden
            with RowStreams(generators):
                mu, logs = model.mog_head.infer(embeds, guidance_scale=scale,
                                                top_p_or_k=top_p_or_k[i] if top_p_or_k is not None else 1.0)
            noise = torch.cat([torch.randn((1, *mu.shape[1:]), generator=g, dtype=mu.dtype, device=mu.device)
                               for g in generators])
            z = mu + torch.exp(logs) * noise * (noise_scale[i] if noise_scale is not None else 1.0)
            code = depthsum_encoding_step(levels, z, code, done, count)
            for level in range(done, done + count):
                depthsum = depthsum + F.embedding(code[..., level], levels[level])
            done += count
    return [code[i : i + 1] for i in range(len(states))], [g.get_state() for g in generators]


__all__ = ["RowStreams", "sample_rows"]
