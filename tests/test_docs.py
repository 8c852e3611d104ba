"""Every ```python block in README.md and docs/*.md runs as written.

Blocks of one file run in order in one fresh interpreter (later blocks may use earlier names), with
the working directory set to a temporary folder. Blocks fenced as ```py or ```text are illustrative
and are not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text(encoding="utf-8"))


def test_block_extraction():
    text = "intro\n```python\nx = 1\n```\n```py\nnot run\n```\n```python\ny = x + 1\n```\n"
    assert BLOCK.findall(text) == ["x = 1\n", "y = x + 1\n"]


@pytest.mark.slow
@pytest.mark.parametrize("doc", [d for d in DOCS if python_blocks(d)], ids=lambda p: p.name)
def test_doc_code_blocks_run(doc: Path, tmp_path: Path):
    script = "\n\n".join(python_blocks(doc))
    (tmp_path / "doc_script.py").write_text(script, encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "doc_script.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, (
        f"{doc.name} code blocks failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )
