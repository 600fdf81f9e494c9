"""``verify-checkpoint DIR`` (``omni/checkpoint_report.py``): the tiny checkpoint verifies clean, single-file and
sharded; a copy with an RNNT tensor renamed, one dropped and one added reports exactly those and exits non-zero."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from safetensors.torch import load_file, save_file

from vllm_omni_voicechat.omni.checkpoint_report import main, verify_checkpoint
from vllm_omni_voicechat.omni.tiny import make_tiny_checkpoint

RENAMED = ("stt_model.rnnt_joint.enc.weight", "stt_model.rnnt_joint.encoder.weight")
DROPPED = "stt_model.rnnt_decoder.prediction.dec_rnn.lstm.bias_hh_l1"
EXTRA = "stt_model.extra_head.weight"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", seed=0)


@pytest.fixture(scope="module")
def tensors(checkpoint) -> dict[str, torch.Tensor]:
    return load_file(str(checkpoint / "model.safetensors"))


def copy_with(checkpoint: Path, folder: Path, tensors: dict[str, torch.Tensor]) -> Path:
    shutil.copytree(checkpoint, folder)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def stage_counts(tensors) -> dict[str, int]:
    codec = sum(n.startswith("tts_model.audio_codec.") for n in tensors)
    talker = sum(n.startswith("tts_model.") for n in tensors) - codec
    return {"thinker": len(tensors) - codec - talker, "talker": talker, "code2wav": codec}


def test_the_tiny_checkpoint_verifies_clean(checkpoint, tensors, capsys):
    report = verify_checkpoint(checkpoint)
    assert report.ok and report.tensors == len(tensors) == 311
    assert {k: len(s.consumed) for k, s in report.stages.items()} == stage_counts(tensors)
    assert sum(len(s.consumed) for s in report.stages.values()) == len(tensors)
    assert all(s.missing == {} for s in report.stages.values())
    assert report.unexpected == {} and report.mismatched == {}
    assert len(report.rnnt) == 15 and report.rnnt["enc.weight"] == {"name": RENAMED[0], "shape": [32, 32]}
    assert report.rnnt["out.weight"] == {"name": "stt_model.rnnt_joint.joint_net.2.weight", "shape": [65, 32]}
    assert report.vocabulary == {"ok": True, "files": ["tokenizer.json", "tokenizer.vocab", "tokenizer_config.json"],
                                 "pieces": 64, "rnnt_rows": 65}
    assert main(str(checkpoint)) == 0
    printed = capsys.readouterr().out
    assert "stage 0 thinker: 138 consumed, 0 missing" in printed and printed.rstrip().endswith("OK")


def test_a_sharded_copy_reads_every_shard_through_the_index(tmp_path, checkpoint, tensors):
    folder = tmp_path / "sharded"
    shutil.copytree(checkpoint, folder)
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(folder / shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: shard for shard, part in shards.items() for n in part}}))
    report = verify_checkpoint(folder)
    assert report.ok and report.files == sorted(shards) and report.tensors == len(tensors)
    assert {k: len(s.consumed) for k, s in report.stages.items()} == stage_counts(tensors)


def test_a_shard_still_downloading_gives_its_names_from_the_index_without_shapes(tmp_path, checkpoint, tensors):
    folder = tmp_path / "partial"
    shutil.copytree(checkpoint, folder)
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    rnnt_half = [n for n in names if "rnnt_joint" in n]  # the joint's shard is not down yet
    rest = [n for n in names if n not in rnnt_half]
    save_file({n: tensors[n] for n in rest}, str(folder / "model-00001-of-00002.safetensors"))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        **{n: "model-00001-of-00002.safetensors" for n in rest},
        **{n: "model-00002-of-00002.safetensors" for n in rnnt_half}}}))
    report = verify_checkpoint(folder)
    assert not report.ok and report.absent_files == ["model-00002-of-00002.safetensors"]
    assert report.tensors == len(tensors) and report.unexpected == {} and report.mismatched == {}
    assert all(s.missing == {} for s in report.stages.values())
    assert {k: len(s.consumed) for k, s in report.stages.items()} == stage_counts(tensors)
    assert report.rnnt["enc.weight"] == {"name": RENAMED[0], "shape": None}
    assert report.rnnt["embed.weight"]["shape"] == [65, 32] and report.vocabulary["ok"] is True


def test_a_renamed_a_dropped_and_an_extra_tensor_are_reported_exactly(tmp_path, checkpoint, tensors, capsys):
    changed = dict(tensors)
    changed[RENAMED[1]] = changed.pop(RENAMED[0])
    del changed[DROPPED]
    changed[EXTRA] = torch.zeros(3)
    folder = copy_with(checkpoint, tmp_path / "broken", changed)
    report = verify_checkpoint(folder)
    assert not report.ok
    assert report.unexpected == {RENAMED[1]: [32, 32], EXTRA: [3]}
    assert report.stages["thinker"].missing == {RENAMED[0]: [32, 32], DROPPED: [128]}
    assert report.stages["talker"].missing == {} and report.stages["code2wav"].missing == {}
    counts = stage_counts(tensors)
    assert {k: len(s.consumed) for k, s in report.stages.items()} == {**counts, "thinker": counts["thinker"] - 2}
    assert report.mismatched == {} and "enc.weight" not in report.rnnt
    assert main(str(folder), as_json=True) == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["ok"] is False and printed["unexpected"] == {RENAMED[1]: [32, 32], EXTRA: [3]}
    assert printed["stages"]["thinker"] == {"consumed": counts["thinker"] - 2,
                                            "missing": {RENAMED[0]: [32, 32], DROPPED: [128]}}


def test_an_rnnt_of_the_wrong_width_or_vocabulary_size_is_reported(tmp_path, checkpoint, tensors):
    changed = dict(tensors)
    changed[RENAMED[0]] = torch.zeros(32, 48)  # not the Conformer's d_model (32): the joint would never get a frame
    folder = copy_with(checkpoint, tmp_path / "wide", changed)
    (folder / "rnnt_tokenizer" / "tokenizer.vocab").write_text("<unk>\t0\n")
    report = verify_checkpoint(folder)
    assert not report.ok and report.unexpected == {} and all(s.missing == {} for s in report.stages.values())
    assert report.mismatched == {RENAMED[0]: {"found": [32, 48], "expected": [32, 32]}}
    assert report.vocabulary["ok"] is False and report.vocabulary["pieces"] == 1


def test_the_cli_runs_it(checkpoint, capsys):
    pytest.importorskip("websockets")  # the CLI's parser imports the talk client
    from vllm_omni_voicechat.cli import main as cli

    assert cli(["verify-checkpoint", str(checkpoint), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stages"]["talker"]["consumed"] == stage_counts(
        load_file(str(checkpoint / "model.safetensors")))["talker"]
