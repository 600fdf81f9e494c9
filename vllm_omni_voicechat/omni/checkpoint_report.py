"""``verify-checkpoint DIR``: which tensors of a downloaded checkpoint each stage will consume, from the safetensors
headers and the folder alone (no weights read, no GPU, no torch).

This is a name/shape rule check, not a meta-device load: building the stages on ``meta`` fails inside vLLM-Omni's
constructors (the perception featurizer computes its mel filterbank with data-dependent ops at construction). The
rules are the loaders' own name maps:

* Stage 0 (thinker): ``stt_model.perception.*``, ``stt_model.llm.*``, the three heads, and the RNNT tensors that
  ``thinker/checkpoint.py:local_rnnt_name`` maps. The RNNT is checked in full: every local name ``RnntModules``
  needs (LSTM layers from the highest layer index found), shapes consistent with the embedding, the joint and
  config.json's Conformer ``d_model``, one checkpoint tensor per local name, and ``rnnt_tokenizer/`` holding one
  piece fewer than the embedding rows.
* Stage 1 (talker): ``tts_model.*`` outside the codec; Stage 2 (codec): ``tts_model.audio_codec.*``.

Anything no rule places is unexpected (an RNNT-looking name the map misses among them: a renamed RNNT tensor shows up
as one unexpected name plus one missing local name). Inside perception, the backbone and the talker only the presence
of the subtree is checked; the strict per-parameter check is vLLM's loader at start-up.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .thinker.checkpoint import local_rnnt_name

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
RNNT_FOLDER = "rnnt_tokenizer"
HEADS = ("stt_model.embed_tokens.weight", "stt_model.lm_head.weight", "stt_model.function_head.weight")
STAGES = ("thinker", "talker", "code2wav")
_SUBTREES = {"thinker": ("stt_model.perception.", "stt_model.llm."), "talker": ("tts_model.",),
             "code2wav": ("tts_model.audio_codec.",)}
_VOCAB_FILES = ("tokenizer.model", "tokenizer.vocab", "vocab.txt")

Shape = list[int]


@dataclass
class StageReport:
    consumed: dict[str, Shape | None] = field(default_factory=dict)
    missing: dict[str, Shape | None] = field(default_factory=dict)
    """Checkpoint name (or subtree ``prefix*``) -> the shape the stage needs (None where only presence is known)."""


@dataclass
class CheckpointReport:
    folder: str
    files: list[str]
    absent_files: list[str]
    """Shards the index names that are not (yet) in the folder: their tensors are listed without shapes."""
    tensors: int
    stages: dict[str, StageReport]
    unexpected: dict[str, Shape | None]
    rnnt: dict[str, dict[str, Any]]
    """Local RNNT name -> {"name": checkpoint name, "shape": ...} for every mapped decoder/joint tensor."""
    mismatched: dict[str, dict[str, Shape]]
    """Checkpoint name -> {"found": shape, "expected": shape} for RNNT tensors of inconsistent shape."""
    vocabulary: dict[str, Any]

    @property
    def ok(self) -> bool:
        return (not self.absent_files and not self.unexpected and not self.mismatched and self.vocabulary["ok"]
                and not any(s.missing for s in self.stages.values()))

    def to_json(self) -> dict[str, Any]:
        return {"folder": self.folder, "ok": self.ok, "files": self.files, "absent_files": self.absent_files,
                "tensors": self.tensors,
                "stages": {k: {"consumed": len(s.consumed), "missing": s.missing} for k, s in self.stages.items()},
                "unexpected": self.unexpected, "rnnt": self.rnnt, "mismatched": self.mismatched,
                "vocabulary": self.vocabulary}


def read_headers(folder: str | Path) -> tuple[list[str], dict[str, tuple[str | None, Shape | None]], list[str]]:
    """(files, name -> (dtype, shape), absent shards) from the index's shards, ``model.safetensors`` or else every
    top-level ``*.safetensors``: each header is an 8-byte little-endian length and that much JSON (no tensor data
    read). A shard the index names but the folder lacks (a download under way) gives its names without shapes."""
    folder = Path(folder)
    tensors: dict[str, tuple[str | None, Shape | None]] = {}
    absent: list[str] = []
    if (folder / INDEX).is_file():
        weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
        absent = [f for f in files if not (folder / f).is_file()]
        tensors.update({n: (None, None) for n, f in weight_map.items() if f in absent})
    elif (folder / SINGLE).is_file():
        files = [SINGLE]
    else:  # shards without an index
        files = sorted(p.name for p in folder.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no {INDEX}, {SINGLE} or other *.safetensors in {folder}")
    for name in (f for f in files if f not in absent):
        with (folder / name).open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for key, value in header.items():
            if key != "__metadata__":
                tensors[key] = (value["dtype"], list(value["shape"]))
    return files, tensors, absent


def _stage_of(name: str) -> str | None:
    if name.startswith("tts_model.audio_codec."):
        return "code2wav"
    if name.startswith("tts_model."):
        return "talker"
    if name in HEADS or name.startswith(_SUBTREES["thinker"]) or local_rnnt_name(name) is not None:
        return "thinker"
    return None


def _dim(found: dict[str, Shape], *where: tuple[str, int]) -> int | None:
    return next((found[k][i] for k, i in where if found.get(k) is not None and len(found[k]) > i), None)


def _rnnt_expected(found: dict[str, Shape], enc_width: int | None) -> dict[str, Shape | None]:
    """Local name -> expected shape for every tensor ``RnntModules.from_state_dict`` needs: rows ``V+1`` and width
    ``P`` from the embedding, joint width ``J`` from the joint, and the encoder width ``E`` from config.json's
    Conformer ``d_model`` (the thinker feeds the joint that frame). None where nothing gives a dimension."""
    layers = 1 + max((int(m.group(1)) for k in found if (m := re.fullmatch(r"lstm\.\w+_l(\d+)", k))), default=0)
    rows = _dim(found, ("embed.weight", 0), ("out.weight", 0), ("out.bias", 0))
    p = _dim(found, ("embed.weight", 1), ("pred.weight", 1), ("lstm.weight_hh_l0", 1))
    j = _dim(found, ("enc.weight", 0), ("enc.bias", 0), ("pred.weight", 0), ("pred.bias", 0), ("out.weight", 1))
    e = enc_width if enc_width is not None else _dim(found, ("enc.weight", 1))

    def shape(*dims: int | None) -> Shape | None:
        return None if any(d is None for d in dims) else list(dims)  # type: ignore[arg-type]

    four_p = 4 * p if p is not None else None
    expected = {"embed.weight": shape(rows, p), "enc.weight": shape(j, e), "enc.bias": shape(j),
                "pred.weight": shape(j, p), "pred.bias": shape(j), "out.weight": shape(rows, j),
                "out.bias": shape(rows)}
    for i in range(layers):
        expected.update({f"lstm.weight_ih_l{i}": shape(four_p, p), f"lstm.weight_hh_l{i}": shape(four_p, p),
                         f"lstm.bias_ih_l{i}": shape(four_p), f"lstm.bias_hh_l{i}": shape(four_p)})
    return expected


def _encoder_width(folder: Path) -> int | None:
    try:
        config = json.loads((folder / "config.json").read_text())
        return int(config["model"]["stt"]["model"]["perception"]["encoder"]["d_model"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _vocabulary(folder: Path, rows: int | None) -> dict[str, Any]:
    vocab = folder / RNNT_FOLDER
    files = sorted(p.name for p in vocab.iterdir() if p.is_file()) if vocab.is_dir() else []
    pieces = None
    for name in ("tokenizer.vocab", "vocab.txt"):  # tokenizer.model alone: its size needs sentencepiece
        if (vocab / name).is_file():
            pieces = len((vocab / name).read_text(encoding="utf-8").splitlines())
            break
    ok = any(f in files for f in _VOCAB_FILES) and (pieces is None or rows is None or pieces + 1 == rows)
    return {"ok": ok, "files": files, "pieces": pieces, "rnnt_rows": rows}


def verify_checkpoint(folder: str | Path) -> CheckpointReport:
    folder = Path(folder).resolve()
    files, tensors, absent = read_headers(folder)
    stages = {name: StageReport() for name in STAGES}
    unexpected: dict[str, Shape | None] = {}
    rnnt_found: dict[str, tuple[str, Shape | None]] = {}
    for name, (_, shape) in sorted(tensors.items()):
        stage = _stage_of(name)
        local = local_rnnt_name(name)
        if stage is None or (local is not None and local in rnnt_found):  # a second tensor for one RNNT slot
            unexpected[name] = shape
            continue
        if local is not None:
            rnnt_found[local] = (name, shape)
        stages[stage].consumed[name] = shape
    thinker = stages["thinker"]
    for head in HEADS:
        if head not in tensors:
            thinker.missing[head] = None
    for stage, prefixes in _SUBTREES.items():
        for prefix in prefixes:
            if not any(n.startswith(prefix) for n in stages[stage].consumed):
                stages[stage].missing[prefix + "*"] = None
    mismatched: dict[str, dict[str, Shape]] = {}
    expected = _rnnt_expected({k: v[1] for k, v in rnnt_found.items()}, _encoder_width(folder))
    # Missing RNNT tensors are named like their siblings (the map's prefix for that subtree, or the first found).
    prefix = next(iter(rnnt_found.values()))[0].split(".")[0] + "." if rnnt_found else "stt_model."
    for local, shape in expected.items():
        if local not in rnnt_found:
            thinker.missing[_checkpoint_name(local, rnnt_found, prefix)] = shape
        elif shape is not None and rnnt_found[local][1] is not None and rnnt_found[local][1] != shape:
            mismatched[rnnt_found[local][0]] = {"found": rnnt_found[local][1], "expected": shape}
    rnnt = {k: {"name": n, "shape": s} for k, (n, s) in sorted(rnnt_found.items())}
    embed = rnnt_found.get("embed.weight")
    return CheckpointReport(folder=str(folder), files=files, absent_files=absent, tensors=len(tensors), stages=stages,
                            unexpected=unexpected, rnnt=rnnt, mismatched=mismatched,
                            vocabulary=_vocabulary(folder, embed[1][0] if embed and embed[1] else None))


_NEMO_SUBTREES = {"embed.": ("decoder", "prediction.embed."), "lstm.": ("decoder", "prediction.dec_rnn.lstm."),
                  "enc.": ("joint", "joint.enc."), "pred.": ("joint", "joint.pred."),
                  "out.": ("joint", "joint.joint_net.2.")}


def _checkpoint_name(local: str, found: dict[str, tuple[str, Shape]], stt_prefix: str) -> str:
    """The checkpoint name a missing RNNT tensor would have, following a found sibling of the same module."""
    group = local.split(".")[0] + "."
    part, nemo = _NEMO_SUBTREES[group]
    leaf = local[len(group):]
    for other_local, (name, _) in found.items():
        if other_local.startswith(group):
            return name[: len(name) - len(other_local[len(group):])] + leaf
    for other_local, (name, _) in found.items():  # the same module (decoder/joint), another subtree
        if _NEMO_SUBTREES[other_local.split(".")[0] + "."][0] == part:
            cut = name.find(_NEMO_SUBTREES[other_local.split(".")[0] + "."][1])
            if cut > 0:
                return name[:cut] + nemo + leaf
    return f"{stt_prefix}rnnt_{part}.{nemo.removeprefix('joint.')}{leaf}"


def format_report(report: CheckpointReport) -> str:
    def shape(s: Shape | None) -> str:
        return "?" if s is None else "[" + ", ".join(map(str, s)) + "]"

    lines = [f"checkpoint {report.folder}: {report.tensors} tensors in {len(report.files)} file(s)"]
    if report.absent_files:
        lines.append(f"  not downloaded yet (names only, from the index): {', '.join(report.absent_files)}")
    for name, stage in report.stages.items():
        lines.append(f"  stage {STAGES.index(name)} {name}: {len(stage.consumed)} consumed, "
                     f"{len(stage.missing)} missing")
        lines += [f"    missing {n} {shape(s)}" for n, s in stage.missing.items()]
    lines.append(f"  unexpected: {len(report.unexpected)}")
    lines += [f"    unexpected {n} {shape(s)}" for n, s in report.unexpected.items()]
    lines.append(f"  rnnt decoder/joint: {len(report.rnnt)} mapped")
    lines += [f"    {local:<22} <- {v['name']} {shape(v['shape'])}" for local, v in report.rnnt.items()]
    lines += [f"    mismatched {n} {shape(v['found'])}, expected {shape(v['expected'])}"
              for n, v in report.mismatched.items()]
    v = report.vocabulary
    lines.append(f"  {RNNT_FOLDER}/: {', '.join(v['files']) or 'absent'} (pieces {v['pieces']}, "
                 f"rnnt rows {v['rnnt_rows']}){'' if v['ok'] else '  <- not usable'}")
    lines.append("OK" if report.ok else "PROBLEMS FOUND")
    return "\n".join(lines)


def main(folder: str, as_json: bool = False) -> int:
    report = verify_checkpoint(folder)
    print(json.dumps(report.to_json(), indent=2) if as_json else format_report(report))
    return 0 if report.ok else 1
