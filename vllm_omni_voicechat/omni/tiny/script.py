"""The tiny checkpoint's behaviour script: random weights arranged so that the real forward pass behaves like a
well-mannered (if dull) Nemotron VoiceChat, and end-to-end tests can assert exact outcomes.

A purely random thinker emits random text while the user talks, which the runtime rightly rejects
(``pre_eou_response_activity``: settlement requires PAD, silence and no function activity), and a random RNNT
never reaches the blank fence. So the LLM's residual stream keeps a reserved subspace (the top 40 of its 64
dimensions) that no random layer writes into (their output rows are zero there), and the two heads read only that
subspace. Each token embedding carries, in that subspace, a pointer to the token its channel should say next:

* text channel (``lm_head``): PAD -> PAD (listening); BOS -> " Hello" -> " there" -> " how" -> " can" -> " I"
  -> " help" -> ... (twelve words) -> EOS -> PAD. Every other token points at PAD. So the model listens until the runtime forces the
  agent BOS at the user's EOU, says twelve words, and ends its own response with EOS.
* function channel (``function_head``, fused at weight 2): PAD -> PAD; SOTC -> the tokens of
  ``<TOOLCALL>[{"name":"get_time","arguments":{}}]</TOOLCALL>`` one per position -> EOTC -> PAD.
* tool trigger: one attention head of the attention layer queries with a BOS flag (set only in BOS's embedding)
  and keys on the ``<AVAILABLE_TOOLS>`` prompt token; a second head keys on the EOTR the runtime appends to an
  injected tool result and subtracts. On the position after a BOS, in a session whose prompt offers tools and before any tool result,
  the function head says SOTC and the text channel holds PAD: the model calls ``get_time`` once per epoch and,
  when the injected result ends (EOTR), says its words in the same response.

Everything else stays random and runs (Conformer perception, Mamba and attention layers, KV and SSM caches, the
talker): only what the heads read is scripted. Two more pieces are scripted outside the LLM:

* the Conformer's channel 0 tracks loudness and the RNNT says ``hello`` once per utterance (blank otherwise; a
  random joint almost never says blank, and settlement needs the blank fence), so the user transcript of any
  spoken turn is ``hello`` and model-owned turn-taking (the tiered dialect) hears words;
* the codec decoder is quiet but not deaf: its last ConvNeXt block emits one constant channel that the spectral
  head turns into a magnitude of about 1e-18 in every bin but DC, where it is about 1e-3, and one latent direction
  of the talker's codes is carried through the decoder into the DC bin's phase. So its PCM16 samples are -1, 0 or
  1 and depend on the codes (a test can see whose noise the talker drew), while every packet stays below the
  runtime's -90 dBFS silence, because settlement requires silent audio on listening positions. Stage 2 decodes one
  1,764-sample packet per position.
"""

from __future__ import annotations

import torch

from . import config as C
from .vocab import BOS, EOS, EOTC, EOTR, PAD, SOTC, text_token_list

Tensors = dict[str, torch.Tensor]

TOOL_NAME = "get_time"
TOOL_CALL_PAYLOAD = '<TOOLCALL>[{"name":"get_time","arguments":{}}]</TOOLCALL>'
# Long enough (a second at the 80 ms clock) for a client to barge in on it, short enough (13 silent positions with the
# EOS) for the runtime's decoded-silence watchdog (20) never to end it first.
RESPONSE_WORDS = (" Hello", " there", " how", " can", " I", " help", " you", " with", " the", " time", " today",
                  " please")
RESPONSE_TEXT = "".join(RESPONSE_WORDS)
TOOLS_TAG = "<AVAILABLE_TOOLS>"
RESULT_MARK = EOTR  # the runtime appends it to every injected result; a prompt never holds it (unlike the tags)

RESERVED_DIMS = 40  # of the LLM's 64: the scripted pointers and flags; the other 24 stay random
POINTER = 4.0  # a chain pointer; beats PAD's own pointers (1 + 2 from the function channel's PAD)
TAG_KEY = 16.0  # the tag tokens' key: dominates that position's RMS so the copied value is about 8
BOS_QUERY = 4.0
QK_GAIN = 3.0
TOOLS_GAIN = 0.8  # copied tag value (~5) -> a TOOLS flag of ~4 in the residual stream
HEAD_GAIN = 8.0  # logit scale of the scripted rows
LOG_MEL_FLOOR = -1.0  # log-mel above 1 counts as sound: silence sits at -16.6, the convolutions' zero padding at 0,
# simulator speech peaks near 3
LOUDNESS_GAIN = 1.0


def _token_ids() -> dict[str, int]:
    tokens, _, _ = text_token_list()
    return {token: i for i, token in enumerate(tokens)}


def _ids_of(texts: tuple[str, ...]) -> list[int]:
    """Vocabulary ids of byte-level token spellings (a leading space is the byte-level "Ġ")."""
    vocab = _token_ids()
    ids = []
    for text in texts:
        spelled = text.replace(" ", "\u0120")
        if spelled not in vocab:
            raise AssertionError(f"{text!r} is not one token of the tiny vocabulary")
        ids.append(vocab[spelled])
    return ids


def payload_ids() -> list[int]:
    """The tool call's token ids, as the tiny text tokenizer encodes the payload (asserted unique: a pointer chain
    needs one successor per token)."""
    from .vocab import _byte_level

    vocab = _token_ids()
    # The payload as the tokenizer splits it: the tool tags are added tokens, the rest is BPE over byte-level text.
    pieces = ["<TOOLCALL>", "[", '{"', "name", '":"', "get", "_", "time", '",', '"', "arguments", '":', "{}", "}]",
              "</TOOLCALL>"]
    if "".join(pieces) != TOOL_CALL_PAYLOAD:
        raise AssertionError("payload pieces drifted")
    ids = [vocab[p] if p in vocab else vocab[_byte_level(p)] for p in pieces]
    if len(set(ids)) != len(ids):
        raise AssertionError("the scripted tool call repeats a token")
    return ids


class _Layout:
    """The reserved dimensions of the LLM's hidden size (the random layers never write them)."""

    def __init__(self, hidden: int) -> None:
        words, payload = len(RESPONSE_WORDS), len(payload_ids())
        base = hidden - RESERVED_DIMS
        self.reserved = range(base, hidden)
        n = 0

        def take(count: int) -> list[int]:
            nonlocal n
            out = list(range(base + n, base + n + count))
            n += count
            return out

        self.text = take(words + 2)  # PAD, words..., EOS
        self.func = take(payload + 3)  # PAD, SOTC, payload..., EOTC
        (self.bos_query,) = take(1)
        (self.tools_key,) = take(1)
        (self.result_key,) = take(1)
        (self.tools,) = take(1)
        if n > hidden - base:
            raise AssertionError(f"the script needs {n} reserved dimensions, {hidden - base} are free")


def apply(tensors: dict[str, Tensors]) -> None:
    """Rewrite the generated stages in place (``weights.all_tensors`` output) to follow the script."""
    _script_thinker(tensors["thinker"])
    _quiet_codec(tensors["codec"])


def _script_thinker(t: Tensors) -> None:
    cfg = C.llm_config()
    hidden = cfg["hidden_size"]
    lay = _Layout(hidden)
    r = list(lay.reserved)
    vocab = _token_ids()
    pad, bos, eos, sotc, eotc = (vocab[x] for x in (PAD, BOS, EOS, SOTC, EOTC))
    words, payload = _ids_of(RESPONSE_WORDS), payload_ids()
    text_targets = [pad, *words, eos]
    func_targets = [pad, sotc, *payload, eotc]
    text_dim = dict(zip(text_targets, lay.text))
    func_dim = dict(zip(func_targets, lay.func))

    # Embeddings: the reserved part is the pointer(s) only.
    emb = t["stt_model.embed_tokens.weight"]
    emb[:, r] = 0.0
    emb[:, text_dim[pad]] = 1.0  # anything unscripted on the text channel -> PAD
    emb[:, func_dim[pad]] = 1.0  # ... and on the function channel
    for token, successor in zip([bos, *words], [*words, eos]):
        emb[token, text_dim[pad]] = 0.0
        emb[token, func_dim[pad]] = 0.0
        emb[token, text_dim[successor]] = POINTER
    emb[eos, text_dim[pad]] = POINTER
    emb[eos, func_dim[pad]] = 0.0
    emb[bos, lay.bos_query] = BOS_QUERY
    for token, successor in zip([sotc, *payload], [*payload, eotc]):
        emb[token, text_dim[pad]] = 1.0
        emb[token, func_dim[pad]] = 0.0
        emb[token, func_dim[successor]] = POINTER
    emb[eotc, func_dim[pad]] = POINTER
    emb[vocab[TOOLS_TAG], lay.tools_key] = TAG_KEY
    # EOTR (function channel, weight 2) ends an injected result: the model goes on speaking in the same response.
    eotr = vocab[RESULT_MARK]
    emb[eotr, text_dim[pad]] = 0.0
    emb[eotr, text_dim[words[0]]] = POINTER / 2
    emb[eotr, lay.result_key] = TAG_KEY

    # The audio channel (perception output) never writes the reserved subspace.
    t["stt_model.perception.proj.weight"][r, :] = 0.0
    t["stt_model.perception.proj.bias"][r] = 0.0

    # No random layer writes the reserved subspace; the attention layer's scripted heads write only the flag.
    heads, kv_heads, head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    per_kv = heads // kv_heads
    for i, kind in enumerate(cfg["hybrid_override_pattern"]):
        p = f"stt_model.llm.layers.{i}.mixer."
        if kind == "M":
            t[p + "out_proj.weight"][r, :] = 0.0
        elif kind == "-":
            t[p + "down_proj.weight"][r, :] = 0.0
        elif kind == "*":
            o = t[p + "o_proj.weight"]
            o[r, :] = 0.0
            for q_head, key_dim, sign in ((0, lay.tools_key, 1.0), (per_kv, lay.result_key, -1.0)):
                kv_head = q_head // per_kv
                q_row, kv_row = q_head * head_dim, kv_head * head_dim
                t[p + "q_proj.weight"][q_row:q_row + head_dim, :] = 0.0
                t[p + "q_proj.weight"][q_row, lay.bos_query] = QK_GAIN
                for name in ("k_proj.weight", "v_proj.weight"):
                    t[p + name][kv_row, :] = 0.0
                t[p + "k_proj.weight"][kv_row, key_dim] = QK_GAIN
                t[p + "v_proj.weight"][kv_row, key_dim] = 1.0
                o[lay.tools, q_row] = sign * TOOLS_GAIN
    if "*" not in cfg["hybrid_override_pattern"]:
        raise AssertionError("the tool trigger needs an attention layer")

    # The heads read only the reserved subspace.
    lm = t["stt_model.lm_head.weight"]
    lm.zero_()
    for token, dim in text_dim.items():
        lm[token, dim] = HEAD_GAIN
    lm[pad, lay.tools] = HEAD_GAIN  # a tool call holds the text channel at PAD
    fh = t["stt_model.function_head.weight"]
    fh.zero_()
    for token, dim in func_dim.items():
        if token != sotc:
            fh[token, dim] = HEAD_GAIN
    fh[sotc, lay.tools] = HEAD_GAIN

    _script_perception(t)
    _script_rnnt(t)


def _script_perception(t: Tensors) -> None:
    """The Conformer's output channel 0 becomes a loudness detector: the subsampling convolutions sum the log-mel
    energy above a floor (ReLU; the floor sits above the zero padding), the encoder layers add nothing (their output projections are zero), and each
    layer's final LayerNorm leaves channel 0 at about +4..5.5 for a loud frame and -0.2 for silence (channel 1
    is a constant 1 before the norms)."""
    p = "stt_model.perception.encoder."
    for name, tensor in t.items():
        if name.startswith(p + "pre_encode."):
            tensor.zero_()
    t[p + "pre_encode.conv.0.weight"][0, 0, :, 1] = 1.0 / 3  # per mel bin (sparse tones would drown in a 3x3 mean)
    t[p + "pre_encode.conv.0.bias"][0] = LOG_MEL_FLOOR
    for depthwise, pointwise in ((2, 3), (5, 6)):
        t[p + f"pre_encode.conv.{depthwise}.weight"][0] = 1.0
        t[p + f"pre_encode.conv.{pointwise}.weight"][0, 0] = 1.0
    out = t[p + "pre_encode.out.weight"]  # [d_model, channels x frequency], channel-major
    freq = out.shape[1] // t[p + "pre_encode.conv.0.weight"].shape[0]
    out[0, :freq] = LOUDNESS_GAIN
    t[p + "pre_encode.out.bias"][1] = 1.0
    for name, tensor in t.items():
        if name.startswith(p + "layers.") and any(name.endswith(f"{blk}.{kind}") for blk in (
                "feed_forward1.linear2", "feed_forward2.linear2", "self_attn.linear_out", "conv.pointwise_conv2")
                for kind in ("weight", "bias")):
            tensor.zero_()


def _script_rnnt(t: Tensors) -> None:
    """One ``hello`` per utterance: the joint emits it when the frame is loud and the predictor is at its start
    state; once emitted, the predictor's output suppresses it until the runtime resets the predictor after 10
    blank positions (NVIDIA's nonblank_reset_after_silence). Silence is always blank."""
    from .vocab import RNNT_VOCAB, _RNNT_PIECES

    hello = _RNNT_PIECES.index("\u2581hello")
    d = "stt_model.rnnt_decoder.prediction."
    j = "stt_model.rnnt_joint."
    for name, tensor in t.items():
        if name.startswith((d, j)):
            tensor.zero_()
    t[d + "embed.weight"][hello, 0] = 3.0
    hidden = t[d + "embed.weight"].shape[1]
    layer = 0
    while f"{d}dec_rnn.lstm.weight_ih_l{layer}" in t:
        bias = t[f"{d}dec_rnn.lstm.bias_ih_l{layer}"]  # gates i, f, g, o: remember nothing, pass the input's g
        bias[:hidden], bias[hidden:2 * hidden], bias[3 * hidden:] = 10.0, -10.0, 10.0
        t[f"{d}dec_rnn.lstm.weight_ih_l{layer}"][2 * hidden, 0] = 1.0 if layer == 0 else 3.0
        layer += 1
    t[j + "enc.weight"][0, 0] = 1.0
    t[j + "pred.weight"][0, 0] = -10.0
    t[j + "joint_net.2.weight"][hello, 0] = 2.0
    t[j + "joint_net.2.bias"][RNNT_VOCAB] = 4.0  # blank


def _quiet_codec(t: Tensors) -> None:
    prefix = "tts_model.audio_codec.decoder.layers."
    decoder = sorted({int(k[len(prefix):].split(".")[0]) for k in t if k.startswith(prefix)})
    for k in t:
        if k.startswith(prefix):
            t[k].zero_()
    last_block = decoder[-2]
    channels = t[f"{prefix}{last_block}.pwconv2.bias"].shape[0]
    t[f"{prefix}{last_block}.pwconv2.bias"][0] = 1.0
    head = t[f"{prefix}{decoder[-1]}.weight"]  # [n_fft + 2, channels, 1]: magnitude rows, then phase rows
    bins = head.shape[0] // 2
    head[:bins, 0, 0] = -40.0
    assert channels == head.shape[1]
    # The code path: a fixed latent direction into channel 1 of the first upsampling layer, carried by the second
    # (the ConvNeXt blocks between are residual), read by the DC bin's phase; the DC bin's magnitude e**-7 keeps
    # |samples| under 1.5 LSB (about -94 dBFS).
    first, second = (t[f"{prefix}{i}.weight"] for i in decoder[:3:2])  # [in, out, kernel] ConvTranspose1d each
    direction = torch.randn(first.shape[0], generator=torch.Generator().manual_seed(20261204))
    first[:, 1, :] = (direction / direction.norm())[:, None]
    second[1, 1, :] = 1.0
    head[bins, 1, 0] = 20.0
    head[0, 0, 0] = -7.0


__all__ = ["RESPONSE_TEXT", "RESPONSE_WORDS", "TOOL_CALL_PAYLOAD", "TOOL_NAME", "apply", "payload_ids"]
