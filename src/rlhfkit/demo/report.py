"""The demo's report: `metrics.json` (everything measured), `report.md` (for people) and PNG plots."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, fields
from functools import partial
from pathlib import Path
from typing import Any

from rlhfkit.demo import plots
from rlhfkit.demo.cache import StageResult
from rlhfkit.demo.config import DemoConfig

ALGO_NAMES = {
    "rloo": "RLOO",
    "ppo": "PPO",
    "ppo-multi-adapter": "PPO (multi-adapter: policy LoRA + reward adapter on one base)",
    "dpo": "DPO",
}


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def make_plots(out: Path, stages: dict[str, StageResult], samples: list[dict[str, Any]]) -> list[Path]:
    folder = out / "plots"
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    sft_loss = plots.sft_loss_plot(folder, stages["sft"].path, "SFT: next-token loss")
    if sft_loss is not None:
        made.append(sft_loss)
    curves = json.loads((stages["rl"].path / "curves.json").read_text("utf-8"))
    if "kl" in curves:  # online RL: learned reward of the samples and KL to the SFT policy, per update
        made.append(
            plots.line_plot(
                folder / "rl_reward.png",
                curves["step"],
                {"learned reward": curves["reward"]},
                "RL: learned-reward score of the samples",
                "update",
                "mean score",
            )
        )
        made.append(
            plots.line_plot(
                folder / "rl_kl.png",
                curves["step"],
                {"KL(policy || SFT)": curves["kl"]},
                "RL: KL to the SFT policy",
                "update",
                "KL (nats per completion)",
            )
        )
    else:  # DPO: implicit rewards of the chosen and rejected completions
        made.append(
            plots.line_plot(
                folder / "rl_reward.png",
                curves["step"],
                {"chosen": curves["reward"], "rejected": curves.get("reward_rejected", [])},
                "DPO: implicit rewards beta * log(pi / pi_ref)",
                "step",
                "implicit reward",
            )
        )
    points = curves.get("win_rate") or {}
    if points.get("step"):  # WinRateCallback during RL: the policy against SFT under the gold judge
        made.append(
            plots.band_plot(
                folder / "win_rate_curve.png",
                points["step"],
                points["rate"],
                points["low"],
                points["high"],
                "RL: win rate against SFT during training (gold judge)",
                "update",
                "win rate",
                level=0.5,
            )
        )
    made.append(
        plots.score_histogram(
            folder / "gold_scores.png",
            {"SFT": [r["sft_gold"] for r in samples], "RL": [r["rl_gold"] for r in samples]},
            "held-out prompts: gold-judge scores",
        )
    )
    return made


def write_metrics(
    cfg: DemoConfig, out: Path, stages: dict[str, StageResult], total_seconds: float
) -> dict[str, Any]:
    """metrics.json: the config, the evaluation stage's summary, and each stage's summary and time."""
    metrics = {
        "config": asdict(cfg),
        "evaluation": stages["evaluation"].summary,
        "stages": {
            name: {
                "summary": s.summary,
                "seconds": round(s.seconds, 2),
                "reused": s.reused,
                "config_hash": s.config_hash,
            }
            for name, s in stages.items()
        },
        "total_seconds": round(total_seconds, 2),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str), encoding="utf-8")
    return metrics


def write_report(
    cfg: DemoConfig,
    out: Path,
    stages: dict[str, StageResult],
    samples: list[dict[str, Any]],
    total_seconds: float,
) -> dict[str, Any]:
    """Write metrics.json, report.md and plots/*.png into `out`; returns the metrics dict."""
    plotted = partial(make_plots, out, stages, samples)
    return write_files(
        cfg, out, stages, total_seconds, plotted, _result_lines(cfg, stages), _sample_lines(cfg, samples)
    )


def write_files(
    cfg: DemoConfig,
    out: Path,
    stages: dict[str, StageResult],
    total_seconds: float,
    make_task_plots: Callable[[], list[Path]],
    result_lines: list[str],
    sample_lines: list[str],
) -> dict[str, Any]:
    """metrics.json, the task's plots, then report.md: the result, the stage table, the plots, the samples
    and the command that reproduces the run. Every task's report; the task gives its plots and lines."""
    metrics = write_metrics(cfg, out, stages, total_seconds)
    made = make_task_plots()
    lines = result_lines + _stage_lines(stages, total_seconds)
    lines += ["## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in made]
    lines += sample_lines
    lines += ["", "Reproduce: `rlhfkit demo " + " ".join(_flags(cfg)) + "`", ""]
    (out / "report.md").write_text("\n".join(lines), encoding="utf-8")
    return metrics


def _result_lines(cfg: DemoConfig, stages: dict[str, StageResult]) -> list[str]:
    evaluation = stages["evaluation"].summary
    algo = ALGO_NAMES[cfg.algo]
    low, high = evaluation["win_rate_ci95"]
    rm = stages["reward"].summary
    base = stages["base"].summary
    return [
        "# rlhfkit demo report",
        "",
        f"SFT -> reward model -> {algo}, on synthetic movie reviews; gold judge: VADER sentiment. "
        f"Size preset `{cfg.size}`, seed {cfg.seed}, {base['parameters'] / 1e6:.2f}M-parameter "
        f"{base['architecture']} policy.",
        "",
        "## Result",
        "",
        f"On {evaluation['num_prompts']} held-out prompts the {cfg.algo} policy beats the SFT policy "
        "under the "
        f"gold judge **{100 * evaluation['win_rate_rl_vs_sft']:.1f}%** of the time "
        f"(95% interval {100 * low:.1f}-{100 * high:.1f}%, ties count half).",
        "",
        "| policy | win rate vs SFT | mean gold score | positive reviews | mean learned reward "
        "| KL to SFT | tokens |",
        "|---|---|---|---|---|---|---|",
        f"| SFT | 50% (itself) | {_fmt(evaluation['gold_score_sft'])} "
        f"| {100 * evaluation['positive_share_sft']:.0f}% | "
        f"{_fmt(evaluation['learned_reward_sft'])} | 0 | {evaluation['mean_tokens_sft']:.1f} |",
        f"| {cfg.algo} | {100 * evaluation['win_rate_rl_vs_sft']:.1f}% "
        f"| {_fmt(evaluation['gold_score_rl'])} | "
        f"{100 * evaluation['positive_share_rl']:.0f}% | {_fmt(evaluation['learned_reward_rl'])} | "
        f"{_fmt(evaluation['kl_rl_to_sft'])} | {evaluation['mean_tokens_rl']:.1f} |",
        "",
        f"Reward model ({rm['kind']}): held-out pairwise accuracy **{_fmt(rm['heldout_accuracy'])}** "
        f"on {stages['preferences'].summary['pairs_eval']} pairs labelled by the gold judge.",
        "",
    ] + _second_judge_lines(cfg, stages)


def judges_sentence(algo: str, evaluation: dict[str, Any]) -> str:
    """Whether the gold judge (VADER) and the second judge (the classifier) tell the same story."""
    from rlhfkit.demo.evaluation import judges_verdict

    gold = judges_verdict(evaluation["win_rate_rl_vs_sft"], *evaluation["win_rate_ci95"])
    second = judges_verdict(
        evaluation["win_rate_rl_vs_sft_classifier"], *evaluation["win_rate_classifier_ci95"]
    )
    said = {"better": "beats SFT", "worse": "loses to SFT", "no difference": "is not told apart from SFT"}
    if gold == second:
        return f"Both judges agree: {algo} {said[gold]} (95% intervals)."
    return (
        "The judges disagree: under VADER, the judge that labelled the preference data, "
        f"{algo} {said[gold]}; "
        f"under the independent classifier it {said[second]}. A win under the labelling judge alone may be "
        "the policy exploiting that judge rather than writing more positive reviews."
    )


def _second_judge_lines(cfg: DemoConfig, stages: dict[str, StageResult]) -> list[str]:
    evaluation = stages["evaluation"].summary
    if "win_rate_rl_vs_sft_classifier" not in evaluation:
        return []
    low, high = evaluation["win_rate_classifier_ci95"]
    judge = stages["polarity_judge"].summary if "polarity_judge" in stages else {}
    return [
        "### Second judge",
        "",
        f"A {judge.get('kind', 'classifier')} trained on the review generator's own polarity labels (never "
        f"VADER's; held-out accuracy **{_fmt(judge.get('heldout_accuracy'))}** on "
        f"{judge.get('heldout_reviews', 'n/a')} generator reviews) judges the same samples: "
        f"{cfg.algo} beats SFT "
        f"**{100 * evaluation['win_rate_rl_vs_sft_classifier']:.1f}%** of the time "
        f"(95% interval {100 * low:.1f}-{100 * high:.1f}%); mean P(positive) "
        f"{_fmt(evaluation['classifier_score_sft'])} (SFT) -> "
        f"{_fmt(evaluation['classifier_score_rl'])} ({cfg.algo}).",
        "",
        judges_sentence(cfg.algo, evaluation),
        "",
        f"Degeneracy check, distinct-2 (distinct word pairs / all word pairs of the completions): SFT "
        f"{_fmt(evaluation.get('distinct_2_sft'))}, {cfg.algo} {_fmt(evaluation.get('distinct_2_rl'))}.",
        "",
    ]


def _stage_lines(stages: dict[str, StageResult], total_seconds: float) -> list[str]:
    lines = ["## Stages", "", "| stage | seconds | reused | summary |", "|---|---|---|---|"]
    for name, stage in stages.items():
        summary = ", ".join(
            f"{k}={_fmt(v)}" for k, v in stage.summary.items() if not isinstance(v, list | dict)
        )
        lines.append(
            f"| {name} | {stage.seconds:.1f} | {'yes' if stage.reused else 'no'} | {_md_cell(summary)} |"
        )
    return lines + ["", f"Total wall time of this run: {total_seconds:.1f} s.", ""]


def _sample_lines(cfg: DemoConfig, samples: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "## Sample completions (held-out prompts)",
        "",
        f"| prompt | SFT | gold | {cfg.algo} | gold |",
        "|---|---|---|---|---|",
    ]
    for row in samples[: cfg.eval_samples_shown]:
        lines.append(
            f"| {_md_cell(row['prompt'])} | {_md_cell(row['sft'])} | {row['sft_gold']:+.3f} | "
            f"{_md_cell(row['rl'])} | {row['rl_gold']:+.3f} |"
        )
    return lines


def _flags(cfg: DemoConfig) -> list[str]:
    """The command line that reproduces this run: algo, size, seed and every flag off its preset value."""
    preset = DemoConfig(task=cfg.task, algo=cfg.algo, size=cfg.size)
    flags = [f"--algo {cfg.algo}", f"--size {cfg.size}", f"--seed {cfg.seed}"]
    if cfg.task != "sentiment":
        flags.insert(0, f"--task {cfg.task}")
    for f in fields(cfg):
        if f.name in ("task", "algo", "size", "seed", "output_dir", "fresh"):
            continue
        value = getattr(cfg, f.name)
        if value != getattr(preset, f.name):
            flags.append(f"--{f.name} {value}")
    return flags
