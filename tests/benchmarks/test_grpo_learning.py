"""benchmarks/grpo_learning.py's pure parts: the shared settings, the curve points, the verdict, the driver's
reward."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


learning = _load("bench_grpo_learning", BENCH / "grpo_learning.py")
driver = _load("bench_trl_grpo_addition", BENCH / "workloads" / "trl_grpo_addition.py")


def test_settings_are_the_addition_demos_grpo_stage():
    from rlhfkit import GRPOConfig
    from rlhfkit.demo.config import DemoConfig

    settings = learning.grpo_settings(DemoConfig(task="addition"))
    assert (settings["per_device_train_batch_size"], settings["num_generations"], settings["max_steps"]) == (
        256,
        8,
        150,
    )
    assert (settings["temperature"], settings["beta"], settings["max_completion_length"]) == (0.4, 0.0, 5)
    assert settings["learning_rate"] == 1e-4 and settings["num_iterations"] == 1
    args = GRPOConfig(output_dir="unused", **settings)  # rlhfkit accepts every key TRL is given
    assert args.loss_type == "dapo" and args.scale_rewards == "group"


def test_point_has_wilson_interval_around_accuracy():
    p = learning.point(25, 5.123, 4.9, 300, 400)
    assert p["accuracy"] == 0.75 and p["wall_seconds"] == 5.12
    low, high = p["ci95"]
    assert low < 0.75 < high and high - low == pytest.approx(0.0843, abs=2e-3)  # 2 * 1.96 * sqrt(.75*.25/400)


def _curve(accuracy: float, wall: float) -> list[dict]:
    return [learning.point(0, 0, 0, 200, 400), learning.point(150, wall, wall, round(accuracy * 400), 400)]


@pytest.mark.parametrize(
    ("k_acc", "k_wall", "met"),
    [(0.8, 20.0, True), (0.75, 20.0, True), (0.7, 20.0, False), (0.8, 40.0, False)],
)
def test_verdict_needs_accuracy_and_wall_time(k_acc, k_wall, met):
    result = learning.verdict({"rlhfkit": _curve(k_acc, k_wall), "trl": _curve(0.75, 30.0)})
    assert result["met"] is met
    assert result["wall_speedup"] == pytest.approx(30.0 / k_wall)


def test_driver_reward_is_exact_match_after_whitespace():
    assert driver.exact_match(["1+2="] * 4, ["3", " 3 ", "33", "4"], answer=["3", "3", "3", "4"]) == [
        1.0,
        1.0,
        0.0,
        1.0,
    ]


def test_driver_reward_agrees_with_rlhfkits():
    from rlhfkit.rewards import exact_match_reward

    completions, answers = ["85", "8 5", "85\n", "", "135"], ["85", "85", "85", "85", "135"]
    expected = exact_match_reward("answer")(completions, answer=answers)
    assert driver.exact_match(["p"] * 5, completions, answer=answers) == expected


@pytest.mark.parametrize(("vllm_acc", "agree"), [(0.76, True), (0.72, True), (0.65, False), (0.85, False)])
def test_vllm_verdict_asks_each_final_accuracy_inside_the_others_interval(vllm_acc, agree):
    # 400 problems at 0.75: the 95% interval is about 0.75 +- 0.042
    result = learning.vllm_verdict({"rlhfkit-vllm": _curve(vllm_acc, 20.0), "rlhfkit": _curve(0.75, 30.0)})
    assert result["within_intervals"] is agree
    assert result["difference"] == pytest.approx(vllm_acc - 0.75) and result["wall_speedup"] == 1.5


def test_use_vllm_and_max_steps_parse():
    args = learning.parse_args(["--use-vllm", "--max-steps", "10"])
    assert args.use_vllm and args.max_steps == 10 and args.vllm_python.endswith(".venv-vllm/bin/python")
    assert not learning.parse_args([]).use_vllm
