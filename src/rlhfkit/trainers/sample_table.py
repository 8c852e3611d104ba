"""What the user sees during RL training: a rich progress bar, and tables of sample completions.

Sample tables are printed with rich and appended to `samples.csv` / `samples.jsonl` in the output
folder, so the completions at every stage of training can be read back afterwards.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

from transformers import TrainerCallback


def print_sample_table(
    queries: Sequence[str], responses: Sequence[str], scores: Sequence[float], title: str
) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=True)
    table.add_column("query")
    table.add_column("model response")
    table.add_column("score", justify="right")
    for query, response, score in zip(queries, responses, scores):
        table.add_row(query, response, f"{score:.4f}")
    Console().print(table)


def save_samples(
    output_dir: str | Path,
    step: int,
    queries: Sequence[str],
    responses: Sequence[str],
    scores: Sequence[float],
) -> None:
    """Append one row per sample to samples.csv and samples.jsonl (columns: step, query, response, score)."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        {"step": step, "query": q, "response": r, "score": float(s)}
        for q, r, s in zip(queries, responses, scores)
    ]
    csv_path = folder / "samples.csv"
    new_file = not csv_path.exists()
    with open(csv_path, "a", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=["step", "query", "response", "score"])
        if new_file:
            writer.writeheader()
        writer.writerows(rows)
    with open(folder / "samples.jsonl", "a", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


class RichProgressCallback(TrainerCallback):
    """A rich progress bar over updates, with the main objective shown as it is logged."""

    def __init__(self) -> None:
        self.progress = None
        self.task = None

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
        )
        self.task = self.progress.add_task(
            "training", total=state.max_steps, completed=state.global_step, info=""
        )
        self.progress.start()

    def on_step_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.progress is None or not logs:
            return
        shown = {
            k: logs[k]
            for k in ("objective/rlhf_reward", "objective/scores", "objective/kl", "reward", "kl")  # RLOO, GRPO
            if k in logs
        }
        info = "  ".join(f"{k.split('/')[-1]}={v:.3g}" for k, v in shown.items())
        self.progress.update(self.task, info=info)
        self.progress.console.print({k: round(v, 5) if isinstance(v, float) else v for k, v in logs.items()})

    def on_train_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
