"""Cached pipeline stages: each stage writes a folder plus a done-marker holding its config hash.

A stage's hash covers its own parameters, the hashes of the stages it reads from and a format
version, so changing an SFT flag re-runs SFT and everything downstream, while a change to the RL
flags reuses SFT and the reward model. Outputs are written into a temporary folder that is renamed
into place only once the stage has finished, so an interrupted run never leaves a half-written stage
behind that a later run would trust.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhfkit.trainers.common.checkpointing import atomic_directory

DONE_FILE = "done.json"
FORMAT_VERSION = 1


@dataclass
class StageResult:
    """A finished stage: where its files are, its hash, and the summary it reported."""

    name: str
    path: Path
    config_hash: str
    summary: dict[str, Any]
    seconds: float
    reused: bool = False


@dataclass
class Stage:
    """One step of the pipeline. `run(folder)` writes the outputs into `folder` and returns a summary."""

    name: str
    title: str
    params: dict[str, Any]
    run: Callable[[Path], dict[str, Any]]
    parents: Sequence[StageResult] = field(default_factory=tuple)

    def config_hash(self) -> str:
        key = {
            "stage": self.name,
            "version": FORMAT_VERSION,
            "params": self.params,
            "parents": {p.name: p.config_hash for p in self.parents},
        }
        blob = json.dumps(key, sort_keys=True, default=str).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()[:16]


def read_done(folder: Path) -> dict[str, Any] | None:
    """The done-marker of a stage folder, or None when the stage is missing or unreadable."""
    marker = folder / DONE_FILE
    if not marker.is_file():
        return None
    try:
        return json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def run_stage(
    stage: Stage, root: Path, fresh: bool = False, announce: Callable[[str], None] = print
) -> StageResult:
    """Reuse the stage's folder when its done-marker matches the current hash (and not `fresh`);
    else run the stage."""
    folder = root / stage.name
    config_hash = stage.config_hash()
    done = None if fresh else read_done(folder)
    if done is not None and done.get("config_hash") == config_hash:
        announce(f"[bold green]✓ {stage.title}[/]: reusing {folder} (config {config_hash})")
        return StageResult(
            stage.name, folder, config_hash, done.get("summary", {}), done.get("seconds", 0.0), True
        )
    if done is not None:
        announce(
            f"[yellow]{stage.title}[/]: config changed ({done.get('config_hash')} -> {config_hash}), "
            "re-running"
        )
    announce(f"[bold cyan]▶ {stage.title}[/]")
    start = time.perf_counter()
    with atomic_directory(folder) as tmp:
        summary = stage.run(Path(tmp))
        seconds = time.perf_counter() - start
        marker = {
            "stage": stage.name,
            "config_hash": config_hash,
            "params": stage.params,
            "parents": {p.name: p.config_hash for p in stage.parents},
            "summary": summary,
            "seconds": round(seconds, 2),
        }
        (Path(tmp) / DONE_FILE).write_text(json.dumps(marker, indent=2, default=str), encoding="utf-8")
    return StageResult(stage.name, folder, config_hash, summary, seconds, False)
