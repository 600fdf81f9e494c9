"""``examples/gpu_verify_thinker.py`` (run by hand on a GPU with the checkpoint): its checkpoint report on a
header-only stand-in, its self-test's pure parts (positions, the perception -> RNNT loop on fakes, the verdict), and
its turns/report against a real simulator server, so the script cannot rot unseen."""

from __future__ import annotations

import base64
import importlib.util
import json
import struct
import sys
import wave
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from vllm_omni_voicechat.server.config import ServerConfig
from vllm_omni_voicechat.audio.speech import render_speech

from .server_fixture import running_server

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "gpu_verify_thinker.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_verify_thinker", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def header_only_checkpoint(folder: Path, names: dict[str, list[int]]) -> None:
    header = json.dumps({k: {"dtype": "F32", "shape": v, "data_offsets": [0, 0]} for k, v in names.items()}).encode()
    (folder / "model-00001-of-00001.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: "model-00001-of-00001.safetensors" for k in names}}))
    (folder / "rnnt_tokenizer").mkdir()
    (folder / "rnnt_tokenizer" / "tokenizer.model").write_bytes(b"")


STAND_IN = {
    "stt_model.rnnt_decoder.prediction.embed.weight": [1025, 640],
    "stt_model.rnnt_decoder.prediction.dec_rnn.lstm.weight_ih_l0": [2560, 640],
    "stt_model.rnnt_joint.enc.weight": [640, 1024], "stt_model.rnnt_joint.pred.bias": [640],
    "stt_model.rnnt_joint.joint_net.2.weight": [1025, 640], "stt_model.rnnt_joint.odd.weight": [1],
    "stt_model.llm.backbone.embeddings.weight": [131072, 4480],
}


def test_the_checkpoint_step_is_the_verify_report_and_fails_on_what_is_missing_or_unexpected(tmp_path):
    g = load_script()
    header_only_checkpoint(tmp_path, STAND_IN)
    results: dict = {}
    assert not g.check_checkpoint(str(tmp_path), results)
    facts = results["checkpoint"]
    assert facts["ok"] is False and facts["tensors"] == 7 and facts["rnnt_mapped"] == 5
    assert facts["consumed"] == {"thinker": 6, "talker": 0, "code2wav": 0}
    assert facts["unexpected"] == {"stt_model.rnnt_joint.odd.weight": [1]}
    assert facts["shapes"]["enc.weight"] == [640, 1024] and facts["vocabulary"] == ["tokenizer.model"]
    lstm = "stt_model.rnnt_decoder.prediction.dec_rnn.lstm."
    assert facts["missing"] == {
        "stt_model.embed_tokens.weight": None, "stt_model.lm_head.weight": None,
        "stt_model.function_head.weight": None, "stt_model.perception.*": None, "tts_model.*": None,
        "tts_model.audio_codec.*": None, "stt_model.rnnt_joint.enc.bias": [640],
        "stt_model.rnnt_joint.pred.weight": [640, 640], "stt_model.rnnt_joint.joint_net.2.bias": [1025],
        f"{lstm}weight_hh_l0": [2560, 640], f"{lstm}bias_ih_l0": [2560], f"{lstm}bias_hh_l0": [2560]}


def test_the_checkpoint_step_skips_a_hub_id(tmp_path):
    results: dict = {}
    assert load_script().check_checkpoint("nvidia/NVIDIA-NemotronLabs-VoiceChat-11B", results)
    assert results["checkpoint"] == {"ok": True, "skipped": "--model is not a local folder"}


def test_speech_positions_are_80_ms_pcm_f32_frames_then_silence():
    g = load_script()
    samples = np.arange(1, 1281 + 1, dtype=np.int16)  # one frame and one sample
    positions = g.speech_positions(samples.tobytes(), tail=2)
    assert [p["source_input_seq"] for p in positions] == [1, 2, 3, 4]
    assert {(p["payload"]["format"], p["payload"]["sample_rate_hz"]) for p in positions} == {("pcm_f32le", 16000)}
    frames = [np.frombuffer(base64.b64decode(p["payload"]["audio"]), dtype="<f4") for p in positions]
    assert [f.size for f in frames] == [1280] * 4
    np.testing.assert_array_equal(frames[0], samples[:1280].astype(np.float32) / 32768.0)
    assert frames[1][0] == np.float32(1281 / 32768.0) and not frames[1][1:].any()
    assert not frames[2].any() and not frames[3].any()


class FakeThinker:
    """Perception that remembers the position's seq; its 'encoder frame' is that seq."""

    def __init__(self):
        self.seen = []

    def _duplex_stable_frame(self, session, duplex, device):
        session["frame"] = duplex["source_input_seq"]
        self.seen.append((duplex["source_input_seq"], device))

    def _rnnt_frame(self, session):
        return session["frame"]


class FakeStream:
    def __init__(self, emits):
        self.emits = emits

    def step(self, frame):
        tokens, delta = self.emits.get(frame, ([], ""))
        return SimpleNamespace(blank=not tokens, text_delta=delta), tokens


def test_the_self_test_feeds_every_position_through_perception_then_the_rnnt():
    g = load_script()
    model = FakeThinker()
    positions = g.speech_positions(bytes(2 * 1280 * 3), tail=1)
    result = g.rnnt_transcript(model, FakeStream({2: ([5, 6], "hel"), 3: ([7], "lo")}), positions, "cuda")
    assert model.seen == [(1, "cuda"), (2, "cuda"), (3, "cuda"), (4, "cuda")]
    assert result == {"transcript": "hello", "positions": 4, "tokens": 3, "blank_positions": 2}
    assert g.judge_self_test(result)
    silent = g.rnnt_transcript(FakeThinker(), FakeStream({}), positions, "cuda")
    assert silent == {"transcript": "", "positions": 4, "tokens": 0, "blank_positions": 4}
    assert not g.judge_self_test(silent)  # all blank: the load passed but the RNNT hears nothing
    assert not g.judge_self_test({"error": "RuntimeError: no perception frame"})


def test_the_self_test_result_comes_back_from_its_child_process_line(tmp_path):
    g = load_script()
    line = g.SELF_TEST_MARK + json.dumps({"transcript": "hi", "positions": 9, "tokens": 1, "blank_positions": 8})
    assert g.parse_self_test(f"log noise\n{line}\n") == {"transcript": "hi", "positions": 9, "tokens": 1,
                                                           "blank_positions": 8}
    assert g.parse_self_test("crashed before printing") == {"error": "the self-test process printed no result"}
    results: dict = {}
    assert g.check_self_test(str(tmp_path), "q.wav", results, skip=True, timeout_s=1)
    assert results["self_test"] == {"ok": True, "skipped": "--skip-self-test"}


def test_the_script_passes_against_the_simulator_and_writes_its_report(tmp_path, capsys):
    g = load_script()
    wavs = {}
    for name, text in (("question", "hello there"), ("tool", "call get_time")):
        wavs[name] = tmp_path / f"{name}.wav"
        with wave.open(str(wavs[name]), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16_000)
            w.writeframes(render_speech(text))
    out = tmp_path / "report.json"
    with running_server(ServerConfig.simulator(settlement_blank_frames=3)) as url:
        code = g.main(["--model", "sim", "--wav", str(wavs["question"]), "--tool-wav", str(wavs["tool"]),
                       "--url", f"{url}/v1/voicechat", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0 and "ALL PASS" in printed
    report = json.loads(out.read_text())
    assert [k for k in report] == ["checkpoint", "self_test", "live_turn", "tool_turn", "budget"]
    assert report["self_test"] == {"ok": True, "skipped": "--model is not a local folder"}
    assert report["live_turn"]["transcript"] == "hello there"
    assert report["tool_turn"]["calls"] == [{"name": "get_time", "arguments": {}, "outcome": "applied"}]
    assert report["tool_turn"]["said_result"] is True and report["budget"]["positions"] > 0
