"""`rlhfkit demo --size tiny` through the command line: report files, learning, stage caching, other algos.

One RLOO run (module fixture) feeds most tests; the other algorithms reuse its base, SFT, preference and
(for PPO) reward-model stages from the same output folder, which is the caching the demo promises.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

STAGES = ("base", "sft", "preferences", "reward_model", "rl-rloo", "polarity_judge", "evaluation-rloo")


def run_demo(output_dir: Path, *flags: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "COLUMNS": "200",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "rlhfkit",
        "demo",
        "--size",
        "tiny",
        "--seed",
        "0",
        "--output_dir",
        str(output_dir),
        *flags,
    ]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"demo failed:\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
    return result


@pytest.fixture(scope="module")
def rloo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    return out, run_demo(out)


def test_report_files_exist_and_parse(rloo_run):
    out, _ = rloo_run
    metrics = json.loads((out / "metrics.json").read_text())
    evaluation = metrics["evaluation"]
    assert metrics["config"]["algo"] == "rloo" and metrics["config"]["size"] == "tiny"
    assert set(metrics["stages"]) == {
        "base",
        "sft",
        "preferences",
        "reward",
        "rl",
        "polarity_judge",
        "evaluation",
    }
    for key in (
        "win_rate_rl_vs_sft",
        "gold_score_sft",
        "gold_score_rl",
        "learned_reward_sft",
        "learned_reward_rl",
        "kl_rl_to_sft",
    ):
        assert isinstance(evaluation[key], float), key
    assert 0.0 <= evaluation["win_rate_rl_vs_sft"] <= 1.0
    report = (out / "report.md").read_text()
    assert f"{100 * evaluation['win_rate_rl_vs_sft']:.1f}%" in report
    for name in ("sft_loss", "rl_reward", "rl_kl", "win_rate_curve", "gold_scores"):
        png = out / "plots" / f"{name}.png"
        assert png.read_bytes()[:4] == b"\x89PNG", name
        assert f"plots/{name}.png" in report
    for stage in STAGES:
        assert json.loads((out / stage / "done.json").read_text())["stage"] == stage
    # the second judge and the win-rate curve of the RL stage (tiny preset: 20 updates, a point every 4)
    assert 0.0 <= evaluation["win_rate_rl_vs_sft_classifier"] <= 1.0 and "second judge" in report.lower()
    assert metrics["stages"]["polarity_judge"]["summary"]["heldout_accuracy"] > 0.93
    curve = json.loads((out / "rl-rloo" / "curves.json").read_text())["win_rate"]
    assert curve["step"] == [4, 8, 12, 16, 20]
    assert all(lo <= r <= hi for r, lo, hi in zip(curve["rate"], curve["low"], curve["high"]))
    assert (
        len((out / "evaluation-rloo" / "samples.jsonl").read_text().splitlines()) == evaluation["num_prompts"]
    )
    # per-update curves of the RL stage: one point per logged update, KL starts near 0 (policy == SFT)
    curves = json.loads((out / "rl-rloo" / "curves.json").read_text())
    assert len(curves["reward"]) == len(curves["kl"]) >= 5
    assert abs(curves["kl"][0]) < 1.0


def test_rl_policy_beats_sft_under_the_gold_judge(rloo_run):
    out, _ = rloo_run
    metrics = json.loads((out / "metrics.json").read_text())
    evaluation = metrics["evaluation"]
    # the reward model learned the judge's preference from SFT samples (chance: 0.5) ...
    assert metrics["stages"]["reward"]["summary"]["heldout_accuracy"] > 0.6
    # ... and optimising it moved the policy towards what the judge prefers, on prompts never trained on
    assert evaluation["learned_reward_rl"] > evaluation["learned_reward_sft"]
    assert evaluation["gold_score_rl"] > evaluation["gold_score_sft"] + 0.1
    assert evaluation["win_rate_ci95"][0] > 0.5, evaluation  # the whole 95% interval is above a coin flip
    assert evaluation["kl_rl_to_sft"] > 0.0


def test_rerun_reuses_every_stage(rloo_run):
    out, _ = rloo_run
    markers = {stage: (out / stage / "done.json").stat().st_mtime_ns for stage in STAGES}
    result = run_demo(out)
    assert result.stdout.count("reusing") == len(STAGES)
    assert {stage: (out / stage / "done.json").stat().st_mtime_ns for stage in STAGES} == markers


@pytest.mark.parametrize(
    ("algo", "flags"),
    [
        ("dpo", ("--dpo_epochs", "1")),
        ("ppo", ("--rl_updates", "4")),
        ("ppo-multi-adapter", ("--rl_updates", "4", "--rm_epochs", "1")),  # trains its own reward adapter
    ],
)
def test_other_algorithms_reuse_the_supervised_stages(rloo_run, algo, flags):
    """Mechanics only (sizes too small to judge learning): each algorithm runs on the cached stages."""
    out, _ = rloo_run
    result = run_demo(out, "--algo", algo, *flags)
    assert "reusing" in result.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["config"]["algo"] == algo
    assert metrics["stages"]["sft"]["reused"] and metrics["stages"]["preferences"]["reused"]
    assert not metrics["stages"]["rl"]["reused"]
    assert 0.0 <= metrics["evaluation"]["win_rate_rl_vs_sft"] <= 1.0
    assert (out / f"rl-{algo}" / "done.json").is_file() and (out / "report.md").is_file()
    curve = json.loads((out / f"rl-{algo}" / "curves.json").read_text())["win_rate"]  # WinRateCallback ran
    assert curve["step"] and all(0.0 <= r <= 1.0 for r in curve["rate"])
    assert (out / "plots" / "win_rate_curve.png").is_file()
