"""PNG plots of the demo (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def line_plot(
    path: Path, x: Sequence[float], series: dict[str, Sequence[float]], title: str, xlabel: str, ylabel: str
) -> Path:
    """One figure, one line per entry of `series` (entries with no values are skipped)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    for label, values in series.items():
        points = [(a, b) for a, b in zip(x, values) if b is not None]
        if points:
            ax.plot([a for a, _ in points], [b for _, b in points], marker="o", markersize=2.5, label=label)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def sft_loss_plot(folder: Path, sft_stage: Path, title: str) -> Path | None:
    """The SFT stage's logged loss per step as `folder/sft_loss.png`; None when nothing was logged."""
    history = json.loads((sft_stage / "log_history.json").read_text("utf-8"))
    losses = [(h["step"], h["loss"]) for h in history if "loss" in h]
    if not losses:
        return None
    steps, values = [s for s, _ in losses], [v for _, v in losses]
    return line_plot(folder / "sft_loss.png", steps, {"loss": values}, title, "step", "cross-entropy")


def score_histogram(path: Path, scores: dict[str, Sequence[float]], title: str) -> Path:
    """Overlaid histograms of gold scores in [-1, 1], one per policy."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    bins = [i / 10 for i in range(-10, 11)]
    for label, values in scores.items():
        ax.hist(values, bins=bins, alpha=0.55, label=label)
    ax.set_title(title)
    ax.set_xlabel("gold score (VADER compound)")
    ax.set_ylabel("completions")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def band_plot(
    path: Path,
    x: Sequence[float],
    values: Sequence[float],
    low: Sequence[float],
    high: Sequence[float],
    title: str,
    xlabel: str,
    ylabel: str,
    level: float | None = None,
) -> Path:
    """One line with a shaded band between `low` and `high` (an interval), and an optional dashed `level`."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    ax.fill_between(x, low, high, alpha=0.25, label="95% interval")
    ax.plot(x, values, marker="o", markersize=3, label=ylabel)
    if level is not None:
        ax.axhline(level, color="grey", linestyle="--", linewidth=1)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
