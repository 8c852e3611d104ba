"""The report of a verifiable-task demo: metrics.json, report.md and PNG plots (reward curve, SFT loss)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlhfkit.demo import plots
from rlhfkit.demo.cache import StageResult
from rlhfkit.demo.config import DemoConfig
from rlhfkit.demo.report import _md_cell


def make_plots(out: Path, stages: dict[str, StageResult]) -> list[Path]:
    folder = out / "plots"
    folder.mkdir(parents=True, exist_ok=True)
    curves = json.loads((stages["rl"].path / "curves.json").read_text("utf-8"))
    made = [
        plots.line_plot(
            folder / "rl_reward.png",
            curves["step"],
            {"mean reward": curves["reward"]},
            "GRPO: exact-match reward of the sampled completions",
            "step",
            "mean reward (share correct)",
        )
    ]
    sft_loss = plots.sft_loss_plot(folder, stages["sft"].path, "SFT warm start: completion-token loss")
    if sft_loss is not None:
        made.append(sft_loss)
    return made


def _percent(ev: dict[str, Any], key: str) -> tuple[str, str]:
    low, high = ev[f"{key}_ci95"]
    return f"{100 * ev[key]:.1f}%", f"{100 * low:.1f}-{100 * high:.1f}%"


def result_lines(cfg: DemoConfig, description: str, stages: dict[str, StageResult]) -> list[str]:
    ev, base = stages["evaluation"].summary, stages["base"].summary
    (sft_acc, sft_ci), (rl_acc, rl_ci) = _percent(ev, "greedy_sft"), _percent(ev, "greedy_rl")
    rows = []
    for name, label in (("sft", "SFT warm start"), ("rl", "GRPO")):
        greedy, sampled = _percent(ev, f"greedy_{name}"), _percent(ev, f"sampled_{name}")
        rows.append(f"| {label} | **{greedy[0]}** | {greedy[1]} | {sampled[0]} | {sampled[1]} |")
    return [
        f"# rlhfkit demo report: {cfg.task} (verifiable reward)",
        "",
        f"Task: {description}. SFT warm start -> GRPO on the exact reward; no reward model, no judge. "
        f"Size preset `{cfg.size}`, seed {cfg.seed}, {base['parameters'] / 1e6:.2f}M-parameter "
        f"{base['architecture']} policy.",
        "",
        "## Result",
        "",
        f"On {ev['num_prompts']} held-out problems (none of them, nor their operands swapped, seen in "
        f"training), greedy accuracy goes from **{sft_acc}** (95% interval {sft_ci}) after SFT to "
        f"**{rl_acc}** ({rl_ci}) "
        f"after GRPO: **{ev['lift_points']:+.1f} points**.",
        "",
        f"| policy | greedy accuracy | 95% interval | sampled accuracy (T={cfg.temperature:g}) "
        "| 95% interval |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "Accuracy: the share of held-out problems whose completion is exactly the answer (and then stops); "
        "greedy decoding, so no sampling luck. Intervals: Wilson score, 95%.",
        "",
    ]


def sample_lines(cfg: DemoConfig, samples: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "## Sample completions (held-out, greedy)",
        "",
        "| prompt | answer | SFT | GRPO |",
        "|---|---|---|---|",
    ]
    for row in samples[: cfg.eval_samples_shown]:
        marks = {name: "✓" if row[name].strip() == row["answer"] else "✗" for name in ("sft", "rl")}
        lines.append(
            f"| `{row['prompt']}` | {row['answer']} | {_md_cell(row['sft'])} {marks['sft']} | "
            f"{_md_cell(row['rl'])} {marks['rl']} |"
        )
    return lines


def print_samples(samples: Sequence[dict[str, Any]], console=None) -> None:
    """A rich table: held-out problems, their answers and the greedy SFT and GRPO completions."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="held-out problems: greedy completions")
    for column in ("prompt", "answer", "SFT", "GRPO"):
        table.add_column(column)
    for row in samples:
        table.add_row(row["prompt"], row["answer"], row["sft"], row["rl"])
    (console or Console()).print(table)
