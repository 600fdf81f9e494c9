"""The tiny checkpoint's two vocabularies: the LLM's text tokenizer (an HF ``tokenizer.json`` folder) and the RNNT's
SentencePiece-style piece list (``rnnt_tokenizer/``).

Text tokenizer layout (the Nemotron-Nano convention the runtime relies on, model.md §3): id 0 ``<unk>``, 1 ``<s>``,
2 ``</s>``, then ``<SPECIAL_N>`` at id N up to the first ordinary token; then the 256 byte-level symbols (any text
encodes), then merges that make a few prompt and tool-JSON words single tokens, then the tool tags as ordinary added
tokens. The special block is sized so that the whole vocabulary is exactly ``TEXT_VOCAB`` (the LLM's vocab).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

TEXT_VOCAB = 1024
BOS, EOS, PAD = "<s>", "</s>", "<SPECIAL_12>"
SOTC, EOTC, EOTR = "<SPECIAL_20>", "<SPECIAL_21>", "<SPECIAL_22>"
# Ordinary (decoded, never skipped) added tokens: the function channel spells its payloads with them.
TOOL_TAGS = ("<TOOLCALL>", "</TOOLCALL>", "<TOOL_RESPONSE>", "</TOOL_RESPONSE>", "<AVAILABLE_TOOLS>",
             "</AVAILABLE_TOOLS>")
# Merged into single tokens: words after a space (byte-level "Ġword"), then bare tool-JSON keys and fragments. Each
# word's merges grow one symbol left to right, and every Ġ-chain outranks every bare chain, so a word after a space
# never splits on another word's merges.
_WORDS = (
    "You are a helpful voice assistant Answer briefly and state the exact value returned by tool can call tools"
    " when needed The user is talking to you Hello hi there how I help today time date weather city name"
    " arguments result call function functions available of in it that for on with as be this please sorry yes"
    " no okay sure thanks get_time get_weather timezone location current what an AI developed by NVIDIA Your Voice"
    " Chat spoken conversational style rather than written one Do not repeat same sentence over again Start"
    " conversation greeting use following assist if required decide any format will execute return responses"
    " from Based additional correct errors found or just respond"
).split()
_JSON = ("name", "arguments", "type", "string", "object", "description", "properties", "required", "get_time",
         "get_weather", "timezone", "location", "UTC", '{"', '":', '",', '"}', '},', '}]', '[{', '{}', '":"', '": {')

_RNNT_PIECES = (
    ["<unk>", "\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["'"]
    + ["\u2581" + w for w in ("the", "a", "to", "and", "you", "i", "it", "is", "what", "time", "hello", "hi",
                             "how", "are", "can", "do", "my", "me", "in", "of", "weather", "yes", "no",
                             "please", "thank", "s", "t", "re", "that", "know", "sky", "color", "blue")]
    + ["ing", "ed"]
)
RNNT_VOCAB = len(_RNNT_PIECES)  # 64: blank is id 64 in the joint (NeMo's blank = vocab size)


@functools.cache
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable-character table (what the ByteLevel pre-tokenizer emits)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _byte_level(text: str) -> str:
    table = _bytes_to_unicode()
    return "".join(table[b] for b in text.encode("utf-8"))


def text_token_list() -> tuple[list[str], list[tuple[str, str]], int]:
    """(tokens by id, BPE merges by rank, size of the special block), deterministic."""
    alphabet = [_bytes_to_unicode()[b] for b in range(256)]
    merged: list[str] = []
    merges: list[tuple[str, str]] = []
    seen = set(alphabet)
    for form in [" " + word for word in _WORDS] + list(_JSON):
        symbols = _byte_level(form)
        current = symbols[0]
        for ch in symbols[1:]:
            pair, current = (current, ch), current + ch
            if current not in seen:
                seen.add(current)
                merged.append(current)
                merges.append(pair)
    n_special = TEXT_VOCAB - len(alphabet) - len(merged) - len(TOOL_TAGS)
    if n_special < 100:
        raise AssertionError(f"text vocabulary too full for the <SPECIAL_N> block ({n_special})")
    specials = ["<unk>", BOS, EOS] + [f"<SPECIAL_{n}>" for n in range(3, n_special)]
    return specials + alphabet + merged + list(TOOL_TAGS), merges, n_special


def write_text_tokenizer(folder: Path) -> None:
    """``tokenizer.json`` + ``tokenizer_config.json``, loadable offline by ``transformers.AutoTokenizer``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens, merges, n_special = text_token_list()
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                     unk_token="<unk>", byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens[:n_special]])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    if tokenizer.get_vocab_size(with_added_tokens=True) != TEXT_VOCAB:
        raise AssertionError("text tokenizer size drifted from TEXT_VOCAB")
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"), pretty=True)
    # The Nano tokenizer's own eos_token is <SPECIAL_12> (model.md §3 gotcha); the checkpoint's config names
    # the real BOS/EOS/PAD for the duplex channels.
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": PAD,
        "unk_token": "<unk>",
        "pad_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
    }
    _write_json(folder / "tokenizer_config.json", config)


def write_rnnt_tokenizer(folder: Path) -> None:
    """NeMo's SentencePiece folder without the binary ``tokenizer.model``: ``tokenizer.vocab`` (``piece<TAB>score``,
    what ``omni/thinker/rnnt.VocabFile`` reads), plus an HF Unigram ``tokenizer.json`` + ``tokenizer_config.json``
    (vLLM-Omni's arg_utils.py:364 says the real folder is auto-detectable as a tokenizer folder)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    scores = [0.0] + [-1.0 - i / 1000 for i in range(1, RNNT_VOCAB)]  # near-equal: fewest pieces win
    (folder / "tokenizer.vocab").write_text(
        "".join(f"{p}\t{s:g}\n" for p, s in zip(_RNNT_PIECES, scores)), encoding="utf-8")
    tokenizer = Tokenizer(models.Unigram(list(zip(_RNNT_PIECES, scores)), unk_id=0, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.save(str(folder / "tokenizer.json"), pretty=True)
    _write_json(folder / "tokenizer_config.json",
                {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "model_max_length": 1000000})


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")
