"""The thinker's RNNT step on CPU with tiny randomly initialised modules of the real structure (no checkpoint)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vllm_omni_voicechat.model.port import RnntEvidence
from vllm_omni_voicechat.omni.thinker.rnnt import (
    RnntModules,
    RnntStream,
    VocabFile,
    greedy_step,
    is_rnnt_name,
    local_rnnt_name,
    start_state,
)

V, H, LAYERS, E, J = 8, 6, 2, 5, 7
PIECES = ["<unk>", "\u2581he", "llo", "\u2581wor", "ld", "\u2581a", "b", "c"]


def tiny(seed: int = 0) -> RnntModules:
    torch.manual_seed(seed)
    return RnntModules(vocab_size=V, pred_hidden=H, num_layers=LAYERS, enc_hidden=E, joint_hidden=J).eval()


def frames(n: int, seed: int = 1) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(E, generator=g) * 3 for _ in range(n)]


def reference_decode(m: RnntModules, xs, max_symbols: int) -> list[list[int]]:
    """Textbook greedy RNNT over a whole utterance (the prediction net re-run over the emitted prefix)."""
    out, emitted = [], []
    with torch.no_grad():
        for f in xs:
            tokens: list[int] = []
            while len(tokens) < max_symbols:
                seq = torch.zeros(1 + len(emitted), 1, H)
                if emitted:
                    seq[1:, 0] = m.embed(torch.tensor(emitted))
                g = m.lstm(seq)[0][-1]
                k = int(m.out(torch.relu(m.enc(f.reshape(1, -1)) + m.pred(g))).argmax())
                if k == V:
                    break
                tokens.append(k)
                emitted.append(k)
            out.append(tokens)
    return out


def test_checkpoint_names_map_onto_the_modules_and_load_strictly():
    src = tiny(3)
    prefix = "stt_model.rnnt_decoder."
    names = {
        "embed.weight": "prediction.embed.weight",
        "enc.weight": "joint.enc.weight", "enc.bias": "joint.enc.bias",
        "pred.weight": "joint.pred.weight", "pred.bias": "joint.pred.bias",
        "out.weight": "joint.joint_net.2.weight", "out.bias": "joint.joint_net.2.bias",
    }
    ckpt = {}
    for local, tensor in src.state_dict().items():
        name = names.get(local) or "prediction.dec_rnn." + local  # lstm.weight_ih_l0 ...
        ckpt[prefix + name] = tensor
    mapped = {local_rnnt_name(k): v for k, v in ckpt.items()}
    assert set(mapped) == set(src.state_dict())
    loaded = RnntModules.from_state_dict(mapped)
    assert (loaded.vocab_size, loaded.enc_hidden, loaded.lstm.num_layers, loaded.blank_id) == (V, E, LAYERS, V)
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, src.state_dict()[k])
    # the backbone, perception, function head and talker are never taken for RNNT tensors
    for other in ("stt_model.llm.backbone.layers.0.mixer.in_proj.weight", "stt_model.perception.encoder.x.weight",
                  "stt_model.function_head.weight", "tts_model.joint.enc.weight"):
        assert local_rnnt_name(other) is None
    assert is_rnnt_name("rnnt_joint.enc.weight") and is_rnnt_name("stt_model.rnnt.joint.enc.weight")
    # the subtrees as their own prefixes (stt_model.rnnt_decoder.prediction..., stt_model.rnnt_joint.enc...)
    assert local_rnnt_name("stt_model.rnnt_joint.enc.bias") == "enc.bias"
    assert local_rnnt_name("stt_model.rnnt_joint.joint_net.2.weight") == "out.weight"
    assert local_rnnt_name("stt_model.rnnt_prediction.embed.weight") == "embed.weight"
    assert local_rnnt_name("stt_model.rnnt_decoder.prediction.dec_rnn.lstm.bias_hh_l1") == "lstm.bias_hh_l1"


@pytest.mark.parametrize("max_symbols", [1, 3])
def test_per_position_steps_with_carried_state_equal_a_whole_utterance_decode(max_symbols):
    m = tiny()
    xs = frames(24)
    state = start_state(m)
    stepped = [greedy_step(m, f, state, max_symbols=max_symbols) for f in xs]
    assert stepped == reference_decode(m, xs, max_symbols)
    assert any(stepped) and any(not t for t in stepped)  # the seed exercises both blank and emitting frames


def test_blank_counting_text_deltas_and_speech_confirmation():
    m = tiny()
    with torch.no_grad():  # joint: token 1 for positive frames, blank otherwise
        m.out.weight.zero_()
        m.out.bias.fill_(0.0)
        m.enc.weight.zero_()
        m.enc.bias.zero_()
        m.enc.weight[0, 0] = 1.0
        m.pred.weight.zero_()
        m.pred.bias.zero_()
        m.out.weight[1, 0] = 10.0
        m.out.bias[V] = 1.0
    stream = RnntStream(m, VocabFile(PIECES), max_symbols=1, reset_after_blanks=None)
    speech, silence = torch.tensor([1.0, 0, 0, 0, 0]), torch.zeros(E)
    got = [stream.step(f)[0] for f in (silence, silence, speech, speech, silence, silence, silence)]
    assert got == [
        RnntEvidence(True, 1, "", False),
        RnntEvidence(True, 2, "", False),
        RnntEvidence(False, 0, "he", True),  # a transcript does not start with the word-start space
        RnntEvidence(False, 0, " he", True),
        RnntEvidence(True, 1, "", False),
        RnntEvidence(True, 2, "", False),
        RnntEvidence(True, 3, "", False),
    ]
    assert stream.state.text == "he he" and stream.positions == 7


def test_the_predictor_resets_at_the_phrase_fence_and_the_blank_count_keeps_counting():
    m = tiny()
    xs = frames(6, seed=5)
    stream = RnntStream(m, VocabFile(PIECES), reset_after_blanks=3)
    with torch.no_grad():
        m.out.bias[V] = 1e4  # every frame blank
    for f in xs[:2]:
        stream.step(f)
    stream.state.pred_out = torch.full_like(stream.state.pred_out, 7.0)  # a non-start predictor
    ev, _ = stream.step(xs[2])
    fresh = start_state(m)
    assert ev.blank_count == 3 and torch.equal(stream.state.pred_out, fresh.pred_out)
    assert stream.step(xs[3])[0].blank_count == 4


def test_reset_restores_the_start_state_and_replays_identically():
    m = tiny()
    xs = frames(16, seed=9)
    stream = RnntStream(m, VocabFile(PIECES), max_symbols=2)
    first = [stream.step(f) for f in xs]
    stream.reset()  # abort: nothing of the previous request survives
    assert stream.positions == 0 and stream.state.blank_count == 0 and stream.state.text == ""
    assert torch.equal(stream.state.pred_out, start_state(m).pred_out)
    again = [stream.step(f) for f in xs]
    other = RnntStream(tiny(), VocabFile(PIECES), max_symbols=2)
    assert first == again == [other.step(f) for f in xs]


def test_vocabulary_files(tmp_path):
    (tmp_path / "tokenizer.vocab").write_text("<unk>\t0\n\u2581hi\t-1.5\nya\t-2\n", encoding="utf-8")
    vocab = VocabFile.load(tmp_path)
    assert [vocab.id_to_piece(i) for i in range(4)] == ["<unk>", "\u2581hi", "ya", ""]
    with pytest.raises(FileNotFoundError):
        VocabFile.load(tmp_path / "missing")


def test_fp32_checkpoint_weights_load_bit_exact_under_vllm_s_bf16_default_dtype():
    """vLLM builds modules under its default dtype context (bf16 for Stage 0, base_loader.py): modules made there
    and then cast to fp32 had rounded the checkpoint's fp32 RNNT weights through bf16 (max abs error 0.0155)."""
    src = tiny(3)
    state = {k: v.clone() for k, v in src.state_dict().items()}
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        loaded = RnntModules.from_state_dict(state)
    finally:
        torch.set_default_dtype(before)
    for name, value in loaded.state_dict().items():
        assert value.dtype == torch.float32 and torch.equal(value, state[name]), name
