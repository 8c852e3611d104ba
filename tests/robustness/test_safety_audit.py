"""Static audit of src/: no pickle from untrusted paths, torch.load only with weights_only=True,
trust_remote_code never on by default, no opting out of safetensors."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rlhfkit

SRC = Path(rlhfkit.__file__).parent
FILES = sorted(SRC.rglob("*.py"))


def _is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _is_false(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    return ""


def audit(source: str, name: str = "<src>") -> list[str]:
    """Every unsafe pattern in `source`, as 'file:line: what'."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        where = f"{name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            if any(
                m and m.split(".")[0] in {"pickle", "dill", "cloudpickle", "joblib", "shelve"} for m in mods
            ):
                problems.append(f"{where}: imports a pickle-based loader")
        if isinstance(node, ast.Call):
            func = _dotted(node.func)
            kwargs = {k.arg: k.value for k in node.keywords if k.arg}
            if func.endswith("torch.load"):
                if not _is_true(kwargs.get("weights_only")):
                    problems.append(f"{where}: torch.load without weights_only=True")
            if func.endswith(("np.load", "numpy.load")) and _is_true(kwargs.get("allow_pickle")):
                problems.append(f"{where}: np.load(allow_pickle=True)")
            if _is_true(kwargs.get("trust_remote_code")):
                problems.append(f"{where}: trust_remote_code=True hard-coded")
            if _is_false(kwargs.get("use_safetensors")) or _is_false(kwargs.get("safe_serialization")):
                problems.append(f"{where}: opts out of safetensors")
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id == "trust_remote_code":
                value = node.value
                if isinstance(value, ast.Call):
                    value = {k.arg: k.value for k in value.keywords}.get("default")
                if _is_true(value):
                    problems.append(f"{where}: trust_remote_code defaults to True")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            for arg, default in pairs:
                if arg.arg == "trust_remote_code" and _is_true(default):
                    problems.append(f"{where}: {node.name}(trust_remote_code=True) default")
    return problems


def test_the_audit_catches_each_pattern():
    bad = """
import pickle
import torch, numpy as np
from dataclasses import field
torch.load("x")
torch.load("x", weights_only=False)
np.load("x", allow_pickle=True)
AutoModel.from_pretrained("x", trust_remote_code=True)
model.save_pretrained("x", safe_serialization=False)
def load(path, trust_remote_code=True): ...
class C:
    trust_remote_code: bool = field(default=True)
"""
    found = audit(bad)
    assert len(found) == 8, found
    good = """
import torch
torch.load("x", weights_only=True, map_location="cpu")
AutoModel.from_pretrained("x", trust_remote_code=False)
def load(path, trust_remote_code=False): ...
"""
    assert audit(good) == []


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_source_file_is_safe(path):
    assert audit(path.read_text(encoding="utf-8"), str(path.relative_to(SRC))) == []
