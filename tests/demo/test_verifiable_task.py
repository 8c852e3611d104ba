"""`rlhfkit demo --task addition`: config plumbing, the Wilson interval, and the pipeline end to end."""

from __future__ import annotations

import json

import pytest

from rlhfkit.commands import demo
from rlhfkit.demo.config import TASK_PRESETS, DemoConfig


def test_accuracy_and_its_wilson_interval_hand_values():
    from rlhfkit.demo.verifiable import _accuracy

    metrics = {}
    # z = 1.96, z^2 = 3.8416. 0/10: centre = (0 + 0.19208) / 1.38416 = 0.13877 and the half-width is
    # 1.96 / 1.38416 * sqrt(3.8416 / 400) = 0.13877, so the interval is [0, 0.27754]
    _accuracy(metrics, "none", [0.0] * 10)
    assert metrics["none"] == 0.0 and metrics["none_ci95"] == [0.0, 0.2775]
    # 5/10: centre 0.5, half-width 1.41602 * sqrt(0.025 + 0.009604) = 0.26341
    _accuracy(metrics, "half", [1.0, 0.0] * 5)
    assert metrics["half"] == 0.5 and metrics["half_ci95"] == [0.2366, 0.7634]
    _accuracy(metrics, "all", [1.0] * 10)  # mirror image of 0/10
    assert metrics["all_ci95"] == [0.7225, 1.0]


def test_task_picks_its_algorithm_and_preset():
    cfg = DemoConfig(task="addition", size="tiny")
    assert cfg.algo == "grpo" and cfg.kl_coef == 0.0 and cfg.temperature == 0.4
    assert cfg.rl_updates == TASK_PRESETS["addition"]["tiny"]["rl_updates"]
    sentiment = DemoConfig()
    assert (sentiment.task, sentiment.algo, sentiment.temperature, sentiment.kl_coef) == (
        "sentiment",
        "rloo",
        0.7,
        0.15,
    )
    assert DemoConfig(task="addition", temperature=0.9).temperature == 0.9  # a flag beats the preset


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"task": "chess"}, "--task must be one of sentiment, addition"),
        ({"task": "addition", "algo": "rloo"}, "--algo must be one of grpo for --task addition"),
        ({"task": "sentiment", "algo": "grpo"}, "--algo must be one of rloo, ppo"),
        ({"task": "addition", "num_generations": 6}, "--num_generations"),
        ({"task": "addition", "sft_target_accuracy": 1.0}, "--sft_target_accuracy"),
    ],
)
def test_bad_task_settings_name_the_flag(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DemoConfig(**kwargs)


def test_unknown_task_fails_before_any_work(tmp_path, capsys):
    assert demo.main(["--task", "chess", "--output_dir", str(tmp_path / "out")]) == 2
    assert "--task must be one of sentiment, addition, calculator, got 'chess'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _run(tmp_path, name):
    from rlhfkit.demo import run_demo

    out = tmp_path / name
    metrics = run_demo(DemoConfig(task="addition", size="tiny", output_dir=str(out)))
    return out, metrics


@pytest.mark.slow
def test_addition_demo_end_to_end_is_deterministic(tmp_path):
    out, metrics = _run(tmp_path, "first")
    for path in ("report.md", "metrics.json", "plots/rl_reward.png", "plots/sft_loss.png"):
        assert (out / path).is_file(), path
    assert (out / "plots/rl_reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sft = metrics["stages"]["sft"]["summary"]
    assert sft["steps"] == 60 and 0.0 <= sft["train_probe_accuracy"] < 0.4  # probed, target not reached
    ev = metrics["evaluation"]
    assert ev["num_prompts"] == 64
    for key in ("greedy_sft", "greedy_rl", "sampled_sft", "sampled_rl"):
        low, high = ev[f"{key}_ci95"]
        assert 0.0 <= low <= ev[key] <= high <= 1.0
    samples = [
        json.loads(line) for line in (out / "evaluation-addition/samples.jsonl").read_text().splitlines()
    ]
    assert len(samples) == 64 and all(
        int(s["answer"]) == sum(map(int, s["prompt"][:-1].split("+"))) for s in samples
    )
    curves = json.loads((out / "rl-grpo-addition/curves.json").read_text())
    assert curves["step"] == [1, 2, 3, 4] and all(0.0 <= r <= 1.0 for r in curves["reward"])
    report = (out / "report.md").read_text()
    assert "held-out problems" in report and "Wilson" in report and "plots/rl_reward.png" in report
    assert "`rlhfkit demo --task addition --algo grpo --size tiny --seed 0`" in report
    # same seed, fresh folder: every measured number agrees exactly
    again_out, again = _run(tmp_path, "second")
    assert again["evaluation"] == ev
    assert json.loads((again_out / "rl-grpo-addition/curves.json").read_text()) == curves
    assert (again_out / "evaluation-addition/samples.jsonl").read_text() == (
        out / "evaluation-addition/samples.jsonl"
    ).read_text()
