"""A tiny random checkpoint of Nemotron VoiceChat in the real file layout, for running vLLM-Omni's three stages on
CPU (docs/tiny-checkpoint.md).

``make_tiny_checkpoint(DIR, seed)`` writes::

    DIR/config.json           the unified NeMo-layout config (model.stt.model / model.speech_generation.model)
    DIR/model.safetensors     every stage's tensors under the real names (stt_model.*, tts_model.*), float32
    DIR/rnnt_tokenizer/       the RNNT's piece vocabulary
    DIR/text_llm/             what ``pretrained_llm`` names: the NemotronH config.json + the text tokenizer
    DIR/tokenizer*.json       the same text tokenizer at the root (vLLM's default tokenizer path is the model's)

The weights follow ``script.py``: random, but arranged so the real forward pass listens (PAD, silence, blank
RNNT), answers a forced BOS with twelve words and its own EOS, and calls ``get_time`` once when the prompt offers tools.

Only torch, safetensors and tokenizers are needed (no vLLM). The same seed gives byte-identical files for the same
DIR; ``config.json`` is the one file that depends on DIR (it names ``DIR/text_llm`` by absolute path, so the
checkpoint resolves offline with no environment variable).
"""

from __future__ import annotations

import json
from pathlib import Path

from . import config, vocab

LLM_FOLDER = "text_llm"  # sorts after rnnt_tokenizer/, like the real layout (no text tokenizer folder first)
RNNT_FOLDER = "rnnt_tokenizer"

__all__ = ["LLM_FOLDER", "RNNT_FOLDER", "make_tiny_checkpoint"]


def make_tiny_checkpoint(directory: str | Path, seed: int = 0) -> Path:
    """Write the tiny checkpoint into ``directory`` (created if needed) and return its absolute path."""
    from safetensors.torch import save_file

    from . import weights

    root = Path(directory).resolve()
    root.mkdir(parents=True, exist_ok=True)
    llm = root / LLM_FOLDER
    llm.mkdir(exist_ok=True)
    _write_json(llm / "config.json", config.llm_config())
    vocab.write_text_tokenizer(llm)
    # Also at the root, where vLLM looks first: a deploy YAML then needs no path to the stage-0 tokenizer (the real
    # checkpoint has none there and needs deploy/voicechat.yaml's tokenizer line).
    vocab.write_text_tokenizer(root)
    vocab.write_rnnt_tokenizer(root / RNNT_FOLDER)
    _write_json(root / "config.json", config.checkpoint_config(str(llm)))
    tensors: dict = {}
    for stage in weights.all_tensors(seed).values():
        tensors.update(stage)
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    return root


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")
