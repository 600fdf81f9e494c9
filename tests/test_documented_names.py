"""Every name README.md and docs/ show is importable: dotted references (``vllm_omni_voicechat.shell.sync.SyncDriver``)
and ``from vllm_omni_voicechat... import a, b`` statements. Names under ``omni/`` need the omni stack (vllm,
vllm_omni, torch): without it they are checked only to exist as files."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOTTED = re.compile(r"vllm_omni_voicechat(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
FROM_IMPORT = re.compile(r"from (vllm_omni_voicechat(?:\.[A-Za-z_][A-Za-z0-9_]*)*) import \(?([^)\n]*(?:\n[^)]*)?)\)?")
OMNI_STACK = ("vllm", "vllm_omni", "torch", "transformers")


def documented() -> set[str]:
    names: set[str] = set()
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        names.update(DOTTED.findall(text))
        for module, imported in FROM_IMPORT.findall(text):
            for part in re.split(r"[,\n]", imported):
                name = part.split("#")[0].strip()
                if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                    names.add(f"{module}.{name}")
    return names


def resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.split(".")[0] in OMNI_STACK:
                raise
            if exc.name != ".".join(parts[:cut]):
                raise
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_the_docs_name_the_public_api_and_the_hosts():
    names = documented()
    for expected in ("vllm_omni_voicechat.render_speech", "vllm_omni_voicechat.decode_speech",
                     "vllm_omni_voicechat.sim.render_speech", "vllm_omni_voicechat.shell.sync.SyncDriver"):
        assert expected in names


@pytest.mark.parametrize("dotted", sorted(documented()))
def test_every_documented_name_imports(dotted: str):
    try:
        assert resolve(dotted) is not None
    except ModuleNotFoundError as exc:
        if not (exc.name and exc.name.split(".")[0] in OMNI_STACK and ".omni" in dotted):
            raise
        module = dotted.split(".")
        path = ROOT.joinpath(*module[:3])  # vllm_omni_voicechat/omni/<module>
        assert path.with_suffix(".py").exists() or path.is_dir(), dotted


def test_the_simulator_speech_codec_from_sim():
    from vllm_omni_voicechat.sim import decode_speech, render_speech

    assert decode_speech(render_speech("hello"), 16_000) == "hello"
