"""The report writer on hand-made stage results: files exist, parse, and quote the measured numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhfkit.demo.cache import StageResult
from rlhfkit.demo.config import DemoConfig
from rlhfkit.demo.report import write_report


def _stage(tmp_path: Path, name: str, summary: dict, files: dict | None = None) -> StageResult:
    folder = tmp_path / name
    folder.mkdir()
    for fname, content in (files or {}).items():
        (folder / fname).write_text(json.dumps(content))
    return StageResult(name, folder, "0123456789abcdef", summary, 1.5)


def _stages(tmp_path: Path, curves: dict) -> dict[str, StageResult]:
    evaluation = {
        "algo": "rloo",
        "num_prompts": 4,
        "win_rate_rl_vs_sft": 0.75,
        "win_rate_ci95": [0.33, 1.0],
        "ties": 1,
        "kl_rl_to_sft": 2.5,
        "gold_score_sft": 0.1,
        "gold_score_rl": 0.6,
        "learned_reward_sft": -0.2,
        "learned_reward_rl": 0.9,
        "positive_share_sft": 0.25,
        "positive_share_rl": 0.75,
        "mean_tokens_sft": 20.0,
        "mean_tokens_rl": 15.0,
    }
    return {
        "base": _stage(tmp_path, "base", {"parameters": 551552, "architecture": "llama"}),
        "sft": _stage(
            tmp_path,
            "sft",
            {"steps": 2},
            {"log_history.json": [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}]},
        ),
        "preferences": _stage(tmp_path, "preferences", {"pairs_eval": 10}),
        "reward": _stage(tmp_path, "reward_model", {"kind": "full reward model", "heldout_accuracy": 0.8}),
        "rl": _stage(tmp_path, "rl-rloo", {"updates": 3}, {"curves.json": curves}),
        "evaluation": _stage(tmp_path, "evaluation-rloo", evaluation),
    }


SAMPLES = [
    {"prompt": "The film", "sft": " was dull | slow", "sft_gold": -0.4, "rl": " was great", "rl_gold": 0.6},
    {"prompt": "I saw", "sft": " it", "sft_gold": 0.0, "rl": " a joy", "rl_gold": 0.5},
]


@pytest.mark.parametrize(
    ("curves", "plots"),
    [
        ({"step": [1, 2, 3], "reward": [0.1, 0.3, 0.5], "kl": [0.0, 1.0, 2.0]}, {"rl_reward", "rl_kl"}),
        ({"step": [1, 2], "reward": [0.1, 0.3], "reward_rejected": [0.0, -0.2]}, {"rl_reward"}),  # DPO
    ],
)
def test_report_files(tmp_path, curves, plots):
    out = tmp_path / "run"
    out.mkdir()
    cfg = DemoConfig(size="tiny", output_dir=str(out), rl_updates=3)
    metrics = write_report(cfg, out, _stages(tmp_path, curves), SAMPLES, total_seconds=12.0)
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk == json.loads(json.dumps(metrics))
    assert on_disk["evaluation"]["win_rate_rl_vs_sft"] == 0.75
    assert on_disk["config"]["size"] == "tiny" and on_disk["stages"]["sft"]["seconds"] == 1.5
    report = (out / "report.md").read_text()
    assert "**75.0%**" in report and "0.800" in report
    assert "`rlhfkit demo --algo rloo --size tiny --seed 0 --rl_updates 3`" in report  # off-preset flags only
    assert "dull \\| slow" in report  # a pipe inside a completion must not break the markdown table
    made = {p.stem for p in (out / "plots").glob("*.png")}
    assert made == {"sft_loss", "gold_scores"} | plots
    for png in (out / "plots").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"plots/{png.name}" in report


def test_report_states_both_judges_and_plots_the_curve(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    curve = {"step": [2, 4], "rate": [0.6, 0.7], "low": [0.4, 0.5], "high": [0.8, 0.85]}
    stages = _stages(
        tmp_path,
        {"step": [1, 2, 3, 4], "reward": [0.1, 0.3, 0.5, 0.6], "kl": [0, 1, 2, 3], "win_rate": curve},
    )
    stages["evaluation"].summary.update(
        win_rate_rl_vs_sft_classifier=0.5,
        win_rate_classifier_ci95=[0.2, 0.8],
        classifier_score_sft=0.4,
        classifier_score_rl=0.45,
        distinct_2_sft=0.9,
        distinct_2_rl=0.3,
    )
    stages["polarity_judge"] = _stage(
        tmp_path, "polarity_judge", {"kind": "logistic regression", "heldout_accuracy": 0.97}
    )
    write_report(DemoConfig(size="tiny", output_dir=str(out)), out, stages, SAMPLES, total_seconds=12.0)
    report = (out / "report.md").read_text()
    # both intervals (gold 33-100%, classifier 20-80%) hold 50%: the judges agree there is no clear difference
    assert "**50.0%**" in report and "held-out accuracy **0.970**" in report and "Both judges agree" in report
    assert "![win_rate_curve](plots/win_rate_curve.png)" in report
    assert (out / "plots" / "win_rate_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert "SFT 0.900, rloo 0.300" in report
