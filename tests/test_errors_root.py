"""One exception root: every exception class this package defines derives from ``VoicechatError`` (and keeps the
builtin it always was). Found by reading the source, so modules that import vLLM (absent from the lean venv) are
checked too."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import vllm_omni_voicechat
from vllm_omni_voicechat.errors import StateError, VoicechatError

PACKAGE = Path(vllm_omni_voicechat.__file__).parent


def _exception_classes() -> dict[str, list[str]]:
    """``module:Class`` -> its bases, for every class that derives from an exception (by its bases' names)."""
    found: dict[str, list[str]] = {}
    names: set[str] = {"VoicechatError"}
    trees = {p: ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}
    changed = True
    while changed:  # a class whose base is one of ours is an exception too
        changed = False
        for path, tree in trees.items():
            for node in tree.body:
                if not isinstance(node, ast.ClassDef):
                    continue
                bases = [ast.unparse(b) for b in node.bases]
                ours = any(b in names for b in bases)
                builtin = any(b.endswith(("Error", "Exception")) or b == "Exception" for b in bases)
                if (ours or builtin) and node.name not in names:
                    names.add(node.name)
                    changed = True
                if node.name in names:
                    found[f"{path.relative_to(PACKAGE)}:{node.name}"] = bases
    return found


def test_every_exception_class_derives_from_the_root():
    classes = _exception_classes()
    assert len(classes) >= 28
    roots = {key: bases for key, bases in classes.items() if not key.endswith(":VoicechatError")}
    own = {key.rsplit(":", 1)[1] for key in classes}
    strays = {key: bases for key, bases in roots.items() if not any(b in own for b in bases)}
    assert strays == {}


def test_the_root_keeps_the_builtins_callers_catch():
    assert issubclass(StateError, VoicechatError) and issubclass(StateError, RuntimeError)
    tools = importlib.import_module("vllm_omni_voicechat.session.tools")
    assert issubclass(tools.InvalidTools, ValueError) and issubclass(tools.InvalidTools, VoicechatError)
    port = importlib.import_module("vllm_omni_voicechat.model.port")
    assert issubclass(port.ModelTimeout, VoicechatError) and issubclass(port.ModelTimeout, RuntimeError)
