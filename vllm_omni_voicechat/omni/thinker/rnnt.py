"""The RNNT decoder + joint over the Conformer frames, one greedy step per 80 ms position (model.md §1, §5).

vLLM-Omni 0.30.0's thinker skips these weights; we load them and run them beside the backbone. The structure is
NeMo's RNNT: a prediction network (``Embedding(V+1, H)`` with blank = V as the "start" input, then a stacked
``LSTM(H, H)``), and a joint ``out(relu(enc(f) + pred(g)))``. Dimensions come from the checkpoint tensors, so
tiny randomly initialised modules of the same structure exercise the same code on CPU.

Greedy step on one frame ``f``: up to ``max_symbols`` times, ``k = argmax joint(f, g)``; blank ends the frame,
anything else is emitted and advances the prediction network. The LSTM state and the last prediction output
carry over to the next position; after ``reset_after_blanks`` consecutive blank positions the predictor is reset
to its start state (NVIDIA's ``nonblank_reset_after_silence`` = 10). The blank count itself keeps counting: it is
the settlement fence's evidence.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from ...model.port import RnntEvidence
from .checkpoint import is_rnnt_name, local_rnnt_name  # noqa: F401  (re-exported)

DEFAULT_MAX_SYMBOLS = 5
DEFAULT_RESET_AFTER_BLANKS = 10
WORD_START = "\u2581"  # SentencePiece's word-start marker


class RnntModules(nn.Module):
    """Prediction network + joint. Blank is the last joint output (index ``vocab_size``)."""

    def __init__(self, *, vocab_size: int, pred_hidden: int, num_layers: int, enc_hidden: int,
                 joint_hidden: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size + 1, pred_hidden)
        self.lstm = nn.LSTM(pred_hidden, pred_hidden, num_layers)
        self.enc = nn.Linear(enc_hidden, joint_hidden)
        self.pred = nn.Linear(pred_hidden, joint_hidden)
        self.out = nn.Linear(joint_hidden, vocab_size + 1)

    @property
    def blank_id(self) -> int:
        return self.vocab_size

    @property
    def enc_hidden(self) -> int:
        return self.enc.in_features

    @classmethod
    def from_state_dict(cls, state: Mapping[str, torch.Tensor]) -> RnntModules:
        """Modules shaped by ``state`` (our local names, see :func:`local_rnnt_name`), loaded strictly."""
        embed = state["embed.weight"]
        layers = 1 + max(int(m.group(1)) for k in state if (m := re.fullmatch(r"lstm\.weight_ih_l(\d+)", k)))
        modules = cls(
            vocab_size=int(embed.shape[0]) - 1,
            pred_hidden=int(embed.shape[1]),
            num_layers=layers,
            enc_hidden=int(state["enc.weight"].shape[1]),
            joint_hidden=int(state["enc.weight"].shape[0]),
        ).to(embed.dtype)  # vLLM loads under its (bf16) default dtype: keep the checkpoint's precision
        modules.load_state_dict(dict(state), strict=True)
        return modules.eval()

    def predict(self, token: int | None, hidden: tuple[torch.Tensor, torch.Tensor] | None):
        """One prediction-network step; ``None`` is the start input (a zero vector, NeMo's blank-as-SOS)."""
        weight = self.embed.weight
        if token is None:
            x = torch.zeros(1, 1, weight.shape[1], dtype=weight.dtype, device=weight.device)
        else:
            x = self.embed(torch.tensor([[token]], device=weight.device))
        g, hidden = self.lstm(x, hidden)
        return g[0], hidden  # [1, H]

    def joint(self, f: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.enc(f) + self.pred(g)))[0]  # [V + 1]


class PieceVocabulary(Protocol):
    def id_to_piece(self, token_id: int) -> str: ...


class VocabFile:
    """The RNNT SentencePiece vocabulary as an id -> piece table (``tokenizer.vocab``: ``piece<TAB>score`` lines;
    ``vocab.txt``: a piece per line). Enough for greedy decoding; ``sentencepiece`` itself is used when present."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def id_to_piece(self, token_id: int) -> str:
        return self.pieces[token_id] if 0 <= token_id < len(self.pieces) else ""

    @classmethod
    def load(cls, folder: str | Path) -> PieceVocabulary:
        folder = Path(folder)
        model = folder / "tokenizer.model"
        try:
            import sentencepiece  # type: ignore[import-not-found]
        except ModuleNotFoundError:
            sentencepiece = None
        if sentencepiece is not None and model.is_file():
            return sentencepiece.SentencePieceProcessor(model_file=str(model))
        for name in ("tokenizer.vocab", "vocab.txt"):
            path = folder / name
            if path.is_file():
                lines = path.read_text(encoding="utf-8").splitlines()
                return cls([line.split("\t", 1)[0] for line in lines])
        raise FileNotFoundError(f"no RNNT vocabulary (tokenizer.model / tokenizer.vocab / vocab.txt) in {folder}")


@dataclass
class RnntState:
    """Per-request RNNT state (lives in the request's model-local session)."""

    hidden: tuple[torch.Tensor, torch.Tensor] | None
    pred_out: torch.Tensor
    blank_count: int = 0
    text: str = ""


def start_state(modules: RnntModules) -> RnntState:
    g, hidden = modules.predict(None, None)
    return RnntState(hidden, g)


@torch.inference_mode()
def greedy_step(modules: RnntModules, frame: torch.Tensor, state: RnntState, *,
                max_symbols: int = DEFAULT_MAX_SYMBOLS) -> list[int]:
    """Decode one encoder frame (``[E]`` or ``[1, E]``); advances ``state`` in place; returns emitted ids."""
    f = frame.reshape(1, -1).to(modules.enc.weight.dtype)
    emitted: list[int] = []
    while len(emitted) < max_symbols:
        k = int(modules.joint(f, state.pred_out).argmax())
        if k == modules.blank_id:
            break
        emitted.append(k)
        state.pred_out, state.hidden = modules.predict(k, state.hidden)
    return emitted


def pieces_text(pieces: list[str]) -> str:
    return "".join(pieces).replace(WORD_START, " ")


class RnntStream:
    """One request's RNNT: greedy steps with state carry-over, blank counting and text deltas."""

    def __init__(self, modules: RnntModules, vocabulary: PieceVocabulary, *, max_symbols: int = DEFAULT_MAX_SYMBOLS,
                 reset_after_blanks: int | None = DEFAULT_RESET_AFTER_BLANKS,
                 on_tokens: Callable[[list[int]], None] | None = None) -> None:
        self.modules = modules
        self.vocabulary = vocabulary
        self.max_symbols = max_symbols
        self.reset_after_blanks = reset_after_blanks
        self.on_tokens = on_tokens
        self.reset()

    def reset(self) -> None:
        """The freshly started state (a new request, an abort)."""
        with torch.inference_mode():
            self.state = start_state(self.modules)
        self.positions = 0

    def step(self, frame: torch.Tensor) -> tuple[RnntEvidence, list[int]]:
        tokens = greedy_step(self.modules, frame, self.state, max_symbols=self.max_symbols)
        self.positions += 1
        s = self.state
        delta = ""
        if tokens:
            s.blank_count = 0
            delta = pieces_text([self.vocabulary.id_to_piece(t) for t in tokens])
            if not s.text:
                delta = delta.lstrip(" ")  # a transcript does not start with the word-start space
            s.text += delta
        else:
            s.blank_count += 1
            if self.reset_after_blanks is not None and s.blank_count == self.reset_after_blanks:
                # Phrase end: predictor back to its start state; the blank count keeps counting.
                with torch.inference_mode():
                    s.pred_out, s.hidden = self.modules.predict(None, None)
        return RnntEvidence(blank=not tokens, blank_count=s.blank_count, text_delta=delta,
                            speech_confirmed=bool(tokens)), tokens
