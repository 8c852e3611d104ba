"""What every results block is made of: the result files (with the commit and command they name) and the
formatting of their figures. Stdlib only, like `render_results.py`, which renders the blocks with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

Record = tuple[str, dict[str, Any]]  # (path relative to ROOT, contents)


# ---------------------------------------------------------------------- result files
def commit_of(data: dict[str, Any]) -> str:
    """The recorded commit (`commit`, or `git_commit` in the benchmark files), hashes cut to 12."""
    commit = str(data.get("commit") or data.get("git_commit") or "")
    head, dirty, tail = commit.partition("-")
    return head[:12] + dirty + tail


def load(path: str) -> Record:
    """A result file, refused when it does not say which commit and command produced it."""
    data = json.loads((ROOT / path).read_text("utf-8"))
    missing = [
        key for key in ("commit", "command") if not (commit_of(data) if key == "commit" else data.get(key))
    ]
    if missing:
        raise ValueError(f"{path}: result file lacks {' and '.join(missing)}; record it with its script")
    return path, data


def source_line(records: list[Record]) -> str:
    parts = [f"`{path}` (commit `{commit_of(data)}`, command `{data['command']}`)" for path, data in records]
    return (
        ("Source: " if len(parts) == 1 else "Sources: ") + "; ".join(parts) + ". Rendered by `make results`."
    )


# ---------------------------------------------------------------------- formatting helpers
def pct(fraction: float, digits: int = 1) -> str:
    return f"{100 * fraction:.{digits}f}%"


def duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def note_text(data: dict[str, Any], before: str = " (", after: str = ")") -> str:
    """The run's note on the machine, unless its command (quoted in the source line) already says it."""
    note = data.get("note")
    return "" if not note or note in data["command"] else f"{before}{note}{after}"


def load_text(machine: dict[str, Any]) -> str:
    before, after = machine.get("load_average_before"), machine.get("load_average_after")
    said = [f"{values[0]:.1f} {when}" for when, values in (("before", before), ("after", after)) if values]
    return f"1-minute load average {' and '.join(said)} the run" if said else "load not recorded"
