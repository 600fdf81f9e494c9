"""``examples/gpu_verify_thinker.py`` (run by hand on a GPU with the checkpoint): its checkpoint inspection on a
header-only stand-in, and its turns/report against a real simulator server, so the script cannot rot unseen."""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
import wave
from pathlib import Path

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
    (folder / "rnnt_tokenizer").mkdir()
    (folder / "rnnt_tokenizer" / "tokenizer.model").write_bytes(b"")


def test_the_checkpoint_step_maps_the_rnnt_tensors_and_names_what_it_could_not(tmp_path):
    g = load_script()
    header_only_checkpoint(tmp_path, {
        "stt_model.rnnt_decoder.prediction.embed.weight": [1025, 640],
        "stt_model.rnnt_decoder.prediction.dec_rnn.lstm.weight_ih_l1": [2560, 640],
        "stt_model.rnnt_joint.enc.weight": [640, 1024], "stt_model.rnnt_joint.pred.bias": [640],
        "stt_model.rnnt_joint.joint_net.2.weight": [1025, 640], "stt_model.rnnt_joint.odd.weight": [1],
        "stt_model.llm.backbone.embeddings.weight": [131072, 4480],
    })
    results: dict = {}
    assert g.check_checkpoint(str(tmp_path), results)
    facts = results["checkpoint"]
    assert facts["rnnt_mapped"] == 5 and facts["rnnt_unmapped"] == ["stt_model.rnnt_joint.odd.weight"]
    assert facts["shapes"]["enc.weight"] == [640, 1024] and facts["vocabulary"] == ["tokenizer.model"]


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
    assert [k for k in report] == ["checkpoint", "live_turn", "tool_turn", "budget"]
    assert report["live_turn"]["transcript"] == "hello there"
    assert report["tool_turn"]["calls"] == [{"name": "get_time", "arguments": {}, "outcome": "applied"}]
    assert report["tool_turn"]["said_result"] is True and report["budget"]["positions"] > 0
