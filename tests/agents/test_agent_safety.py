"""Nothing a model writes is run as code: the agents package calls no evaluator, compiler or shell."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rlhfkit.agents

AGENTS = Path(rlhfkit.agents.__file__).parent
FORBIDDEN = {"eval", "exec", "compile", "literal_eval", "system", "popen", "Popen", "run", "call"}
SHELL_MODULES = {"os", "subprocess", "ast", "builtins", "pty", "commands"}


def evaluator_calls(source: str) -> list[str]:
    """`eval(...)`, `exec(...)`, `os.system(...)`, `subprocess.run(...)` and the like in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in {"eval", "exec", "compile", "__import__"}:
            found.append(f"line {node.lineno}: {func.id}")
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id in SHELL_MODULES and func.attr in FORBIDDEN:
                found.append(f"line {node.lineno}: {func.value.id}.{func.attr}")
    return found


def test_the_audit_finds_what_it_looks_for():
    source = "eval(x)\nimport os\nos.system(y)\nsubprocess.run(z)\nast.literal_eval(w)\njson.loads(v)\n"
    assert evaluator_calls(source) == [
        "line 1: eval",
        "line 3: os.system",
        "line 4: subprocess.run",
        "line 5: ast.literal_eval",
    ]


@pytest.mark.parametrize("path", sorted(AGENTS.glob("*.py")), ids=lambda p: p.name)
def test_agents_modules_run_nothing_the_model_wrote(path):
    source = path.read_text(encoding="utf-8")
    assert evaluator_calls(source) == []
    assert "import subprocess" not in source and "shell=True" not in source
