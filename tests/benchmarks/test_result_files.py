"""benchmarks/ holds scripts and current result files, and its README's table lists every result file."""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
NOT_RESULTS = {"README.md", "FINDINGS.md", ".gitignore"}


def result_files() -> set[str]:
    """Every file under benchmarks/ that a script wrote, relative to benchmarks/ (scripts, their inputs and
    the gitignored working folders left out)."""
    found = set()
    for path in BENCH.rglob("*"):
        rel = path.relative_to(BENCH)
        if not path.is_file() or any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
            continue
        if rel.parts[0] in ("workloads", "gpu") or path.suffix in (".py", ".sh") or str(rel) in NOT_RESULTS:
            continue
        if path.name.startswith("constraints-"):  # pins for setup_trl.sh, not results
            continue
        found.add(rel.as_posix())
    return found


def listed_files() -> set[str]:
    """The files named in the first column of the README's result-file table."""
    text = (BENCH / "README.md").read_text(encoding="utf-8")
    table = text.split("## Result files", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([^`]+)`", row.split(" | ")[0])}


def test_every_result_file_is_listed_in_the_readme():
    assert result_files() - listed_files() == set()


def test_every_listed_result_file_exists():
    assert listed_files() and listed_files() - result_files() == set()
