"""The tiny checkpoint's behaviour script (omni/tiny/script.py), checked below the engine: the text tokenizer spells
the scripted chains, a reference forward of the NemotronH backbone (transformers, fp32) follows the script, and our
thinker's streaming perception + RNNT hear speech as one ``hello`` per utterance and silence as blank.
The engine run of the same script is tests/test_engine_e2e.py."""

from __future__ import annotations

import base64

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the omni venvs have it)")
pytest.importorskip("vllm_omni", reason="vllm_omni is not installed (scripts/install_omni_cpu.sh)")

from vllm_omni_voicechat.omni.tiny import script  # noqa: E402
from vllm_omni_voicechat.omni.tiny.vocab import BOS, EOS, EOTC, EOTR, PAD, SOTC, text_token_list  # noqa: E402

from .test_omni_tiny_checkpoint import (  # noqa: E402,F401  (module fixtures)
    FRAME_IN,
    build_stage,
    checkpoint,
    distributed,
    thinker_args,
)


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(checkpoint))


def ids(*tokens: str) -> list[int]:
    vocab = {t: i for i, t in enumerate(text_token_list()[0])}
    return [vocab[t] for t in tokens]


def test_the_text_tokenizer_spells_the_scripted_chains(tokenizer):
    assert tokenizer.encode(script.TOOL_CALL_PAYLOAD, add_special_tokens=False) == script.payload_ids()
    words = [tokenizer.convert_tokens_to_ids(w.replace(" ", "\u0120")) for w in script.RESPONSE_WORDS]
    assert [tokenizer.decode([w]) for w in words] == list(script.RESPONSE_WORDS)
    assert tokenizer.encode("<AVAILABLE_TOOLS>", add_special_tokens=False) == ids(script.TOOLS_TAG)


@pytest.fixture(scope="module")
def backbone(checkpoint):
    """The thinker's NemotronH with the checkpoint's weights in transformers (fp32), plus the fusion tables."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from vllm_omni_voicechat.omni.tiny import LLM_FOLDER

    config = AutoConfig.from_pretrained(str(checkpoint / LLM_FOLDER))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    tensors = load_file(str(checkpoint / "model.safetensors"))
    state = {"model." + k.removeprefix("stt_model.llm."): v for k, v in tensors.items() if k.startswith("stt_model.llm.")}
    state["model.embeddings.weight"] = tensors["stt_model.embed_tokens.weight"]
    state["lm_head.weight"] = tensors["stt_model.lm_head.weight"]
    assert model.load_state_dict(state, strict=True)
    return model, tensors["stt_model.embed_tokens.weight"], tensors["stt_model.function_head.weight"]


def run_script(backbone, prompt_ids, forced_text: dict[int, int], forced_func: dict[int, int], steps: int):
    """Greedy duplex decode the way the thinker fuses (prompt in the audio slot, text + 2 x function channel),
    with random audio outside the reserved subspace; forced tokens replace the model's choice at their step."""
    model, embed, function_head = backbone
    pad = ids(PAD)[0]
    g = torch.Generator().manual_seed(1)

    free = embed.shape[1] - script.RESERVED_DIMS  # the perception never writes the reserved subspace

    def audio():
        a = torch.zeros(embed.shape[1])
        a[:free] = torch.randn(free, generator=g)
        return a

    rows = [embed[i] + 3 * embed[pad] for i in prompt_ids] + [audio() + 3 * embed[pad]]
    out = []
    for step in range(steps):
        with torch.no_grad():
            result = model(inputs_embeds=torch.stack(rows).unsqueeze(0), output_hidden_states=True, use_cache=False)
        hidden = result.hidden_states[-1][0, -1]
        text, func = int(result.logits[0, -1].argmax()), int((function_head @ hidden).argmax())
        text, func = forced_text.get(step, text), forced_func.get(step, func)
        out.append((text, func))
        rows.append(audio() + embed[text] + 2 * embed[func])
    return out


def prompt(tokenizer, tools: bool) -> list[int]:
    from vllm_omni_voicechat.model.port import SessionPrompt, ToolSpec
    from vllm_omni_voicechat.model.prompt import render_system_prompt

    specs = (ToolSpec(script.TOOL_NAME, "The local time", {"type": "object", "properties": {}}),) if tools else ()
    text = render_system_prompt(SessionPrompt("You are helpful.", specs))
    return ids(BOS) + tokenizer.encode(text, add_special_tokens=False) + ids(EOS)


def test_the_backbone_listens_answers_a_forced_bos_and_ends_with_eos(backbone, tokenizer):
    pad, bos, eos = ids(PAD, BOS, EOS)
    words = [tokenizer.convert_tokens_to_ids(w.replace(" ", "\u0120")) for w in script.RESPONSE_WORDS]
    out = run_script(backbone, prompt(tokenizer, tools=False), {3: bos}, {}, 3 + len(words) + 4)
    assert [t for t, _ in out] == [pad] * 3 + [bos] + words + [eos] + [pad] * 2
    assert {f for _, f in out} == {pad}


def test_with_tools_the_backbone_calls_get_time_then_speaks_after_the_result(backbone, tokenizer):
    pad, bos, sotc, eotc, eotr = ids(PAD, BOS, SOTC, EOTC, EOTR)
    payload = script.payload_ids()
    call_end = 4 + len(payload) + 1  # BOS forced at step 3, SOTC at 4, the payload, EOTC at call_end
    result = tokenizer.encode('<TOOL_RESPONSE>["12:00"]</TOOL_RESPONSE>', add_special_tokens=False) + [eotr]
    inject = {call_end + 2 + i: tok for i, tok in enumerate(result)}  # the runtime's forced function tokens
    steps = call_end + 2 + len(result) + len(script.RESPONSE_WORDS) + 2
    out = run_script(backbone, prompt(tokenizer, tools=True), {3: bos} | {s: pad for s in inject}, inject, steps)
    assert [f for _, f in out[:call_end + 1]] == [pad] * 4 + [sotc] + payload + [eotc]
    assert [t for t, _ in out[:call_end + 2]] == [pad] * 3 + [bos] + [pad] * (call_end - 2)  # text held at PAD
    spoken = [t for t, _ in out[call_end + 2 + len(result):]]
    words = [tokenizer.convert_tokens_to_ids(w.replace(" ", "\u0120")) for w in script.RESPONSE_WORDS]
    assert spoken == words + ids(EOS) + [pad]  # after EOTR: the words, in the same response
    later = run_script(backbone, prompt(tokenizer, tools=True), {3: bos} | {s: pad for s in inject} | {steps: bos},
                       inject, steps + 3)
    assert later[-2][1] == pad  # a second BOS after a result calls nothing: once per epoch


@pytest.fixture(scope="module")
def our_thinker(distributed, checkpoint):
    from vllm_omni_voicechat.omni.thinker import ARCHITECTURE, register_architecture

    register_architecture()
    return build_stage(checkpoint, **thinker_args(checkpoint, ARCHITECTURE))[1]


def hear(thinker, pcm16: bytes) -> list[list[int]]:
    """RNNT tokens per 80 ms frame through the thinker's streaming perception."""
    import numpy as np

    from vllm_omni_voicechat.omni.thinker.rnnt import RnntStream

    session: dict = {}
    stream = RnntStream(thinker.rnnt, thinker._vocabulary())
    f32 = np.frombuffer(pcm16, dtype="<i2").astype("<f4") / 32768.0
    tokens = []
    for seq, start in enumerate(range(0, len(f32) - FRAME_IN + 1, FRAME_IN), start=1):
        frame = f32[start:start + FRAME_IN].tobytes()
        duplex = {"source_input_seq": seq, "payload": {"format": "pcm_f32le", "sample_rate_hz": 16000,
                                                        "audio": base64.b64encode(frame).decode()}}
        thinker._duplex_stable_frame(session, duplex, torch.device("cpu"))
        tokens.append(stream.step(thinker._rnnt_frame(session))[1])
    return tokens


def test_the_rnnt_hears_one_hello_per_utterance_and_blank_silence(our_thinker):
    from vllm_omni_voicechat.omni.tiny.vocab import _RNNT_PIECES
    from vllm_omni_voicechat.audio.speech import render_speech

    hello = _RNNT_PIECES.index("\u2581hello")
    silence = bytes(2 * FRAME_IN * 12)
    utterance = render_speech("what time is it")
    heard = hear(our_thinker, silence + utterance + silence + utterance + silence)
    emitted = [(i, t) for i, frame in enumerate(heard) for t in frame]
    assert [t for _, t in emitted] == [hello, hello]
    speech_frames = len(utterance) // (2 * FRAME_IN)
    assert emitted[0][0] in range(12, 12 + speech_frames + 1)
    assert all(not frame for frame in heard[:12])
