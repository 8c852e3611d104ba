"""What the user sees during RL training: a rich progress bar, and tables of sample completions.

Sample tables are printed with rich and appended, each row with its step and table name, to
`samples.jsonl` / `samples.csv` in the output folder and to TensorBoard as text, so the completions at
every stage of training can be read back afterwards; nothing is overwritten (`save_samples`).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
    *,
    table: str = "samples",
    columns: Mapping[str, Sequence[Any]] | None = None,
    writer: Any = None,
) -> bool:
    """Append one table of samples, tagged with its step and `table` name; returns whether it was written.

    Rows go to samples.jsonl (every column: step, table, query, response, score and the extra `columns`)
    and samples.csv (the first five), and, given a TensorBoard `writer` (`text_writer(trainer)`), as
    markdown text under `samples/<table>`. A (table, step) pair already in samples.jsonl is not written
    again: a resumed run repeats the steps after its checkpoint, and their rows from before stay.
    """
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    jsonl_path = folder / "samples.jsonl"
    if (table, step) in _written_tables(jsonl_path):
        return False
    rows = [
        {"step": step, "table": table, "query": q, "response": r, "score": _plain(float(s))}
        for q, r, s in zip(queries, responses, scores)
    ]
    for name, values in (columns or {}).items():
        if len(values) != len(rows):
            raise ValueError(f"columns[{name!r}] has {len(values)} values for {len(rows)} rows")
        for row, value in zip(rows, values):
            row[name] = _plain(value)
    csv_path = folder / "samples.csv"
    new_file = not csv_path.exists()
    with open(csv_path, "a", newline="", encoding="utf-8") as fh:
        writer_csv = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        if new_file:
            writer_csv.writeheader()
        writer_csv.writerows(rows)
    with open(jsonl_path, "a", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    if writer is not None:
        writer.add_text(f"samples/{table}", markdown_table(rows), global_step=step)
        writer.flush()
    return True


CSV_COLUMNS = ["step", "query", "response", "score", "table"]


def _plain(value: Any) -> Any:
    """A JSON-safe cell: a non-finite float (a reward function that returned None) becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _written_tables(path: Path) -> set[tuple[str, int]]:
    """The (table, step) pairs samples.jsonl already holds (rows of older files count as table "samples")."""
    if not path.exists():
        return set()
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return {(row.get("table", "samples"), row["step"]) for row in rows}


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows as a markdown table (TensorBoard renders text summaries as markdown); the step column left out."""
    names = [k for k in rows[0] if k not in ("step", "table")] if rows else []

    def cell(value: Any) -> str:
        text = f"{value:.4f}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    lines += ["| " + " | ".join(cell(row.get(n)) for n in names) + " |" for row in rows]
    return "\n".join(lines)


def text_writer(trainer: Any) -> Any:
    """The TensorBoard `SummaryWriter` the trainer already logs to, or None when TensorBoard is off.

    A `transformers.Trainer` reports through its `TensorBoardCallback` (writer made at train begin);
    `PPOTrainer` through its accelerate trackers (`config.log_with="tensorboard"`).
    """
    handler = getattr(trainer, "callback_handler", None)
    if handler is not None:
        return next(
            (cb.tb_writer for cb in handler.callbacks if getattr(cb, "tb_writer", None) is not None), None
        )
    trackers = getattr(getattr(trainer, "accelerator", None), "trackers", None) or []
    return next((t.tracker for t in trackers if t.name == "tensorboard"), None)


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
        keys = ("objective/rlhf_reward", "objective/scores", "objective/kl", "reward", "kl")  # RLOO, GRPO
        shown = {k: logs[k] for k in keys if k in logs}
        info = "  ".join(f"{k.split('/')[-1]}={v:.3g}" for k, v in shown.items())
        self.progress.update(self.task, info=info)
        self.progress.console.print({k: round(v, 5) if isinstance(v, float) else v for k, v in logs.items()})

    def on_train_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
