"""What every demo pipeline runs its stages with: a console, a runner that caches stages, a quiet runtime."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhfkit.demo.cache import Stage, StageResult, run_stage
from rlhfkit.demo.config import DemoConfig


def make_console():
    from rich.console import Console

    return Console()


def print_summary(console, stage: Stage, result: StageResult) -> None:
    from rich.table import Table

    table = Table(
        title=f"{stage.title}: {'reused' if result.reused else f'{result.seconds:.1f} s'}",
        show_header=False,
        title_justify="left",
    )
    for key, value in result.summary.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)


def stage_runner(
    cfg: DemoConfig, root: Path, console: Any, results: dict[str, StageResult]
) -> Callable[[str, Stage], StageResult]:
    """`run(key, stage)`: run or reuse the stage under `root`, print its summary, keep it in
    `results[key]`."""
    from transformers import set_seed

    def run(key: str, stage: Stage) -> StageResult:
        set_seed(cfg.seed)  # each stage starts from the same RNG state, reused or not
        result = run_stage(stage, root, fresh=cfg.fresh, announce=console.print)
        print_summary(console, stage, result)
        results[key] = result
        return result

    return run


def quiet_runtime(cfg: DemoConfig) -> None:
    """Thread count from the config; transformers logs only errors, so the console keeps the summaries."""
    import torch
    from transformers.utils import logging as hf_logging

    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # no per-file "Loading weights" bars; training bars stay


@dataclass
class DemoRun:
    """One demo run under `root`: its console, the stage results so far, and `run(key, stage)` to add one."""

    root: Path
    console: Any
    run: Callable[[str, Stage], StageResult]
    results: dict[str, StageResult] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    def seconds(self) -> float:
        return time.perf_counter() - self.started


def begin(cfg: DemoConfig) -> DemoRun:
    """A quiet runtime, the output folder, a console and a stage runner: how every demo pipeline starts."""
    quiet_runtime(cfg)
    console = make_console()
    root = Path(cfg.output_dir)
    root.mkdir(parents=True, exist_ok=True)
    results: dict[str, StageResult] = {}
    return DemoRun(root, console, stage_runner(cfg, root, console, results), results)
