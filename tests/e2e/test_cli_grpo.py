"""`rlhfkit grpo` end to end: a built-in task with its own reward, a local dataset with a reward function
given by import path and a local reward model, and clear errors for missing rewards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Dataset

from rlhfkit.commands.grpo import main
from rlhfkit.testing import tiny_model_path

TINY_RUN = ["--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "4",
            "--max_steps", "2", "--report_to", "none", "--use_cpu", "--logging_steps", "1", "--save_strategy",
            "no", "--disable_tqdm", "true"]  # fmt: skip


@pytest.mark.slow
def test_grpo_command_on_a_task_in_a_subprocess(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    args = ["--model_name_or_path", str(tiny_model_path("llama")), "--dataset_name", "keyword",
            "--output_dir", str(out), "--beta", "0.05", "--loss_type", "grpo",
            "--scale_rewards", "false"]  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "rlhfkit", "grpo", *args, *TINY_RUN],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["updates"] == 2 and summary["last_reward"] is not None
    assert (out / "model.safetensors").exists()


def test_grpo_command_with_import_path_rewards_and_a_reward_model(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_rewards.py").write_text(
        "def has_e(prompts, completions, **columns):\n    return [float('e' in c) for c in completions]\n"
    )
    Dataset.from_dict({"prompt": ["the film was", "a story about"] * 4}).to_json(str(tmp_path / "data.jsonl"))
    monkeypatch.chdir(tmp_path)
    code = main([
        "--model_name_or_path", str(tiny_model_path("llama")), "--dataset_name", str(tmp_path / "data.jsonl"),
        "--output_dir", str(tmp_path / "run"), "--reward_funcs", "my_rewards.has_e",
        "--reward_model_name_or_path", str(tiny_model_path("llama-reward")), "--reward_weights", "1.0", "0.5",
        *TINY_RUN,
    ])  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["updates"] == 2


def test_grpo_command_trains_addition_against_its_answer_column(tmp_path, capsys, monkeypatch):
    from rlhfkit.tasks import TASKS

    scored = []  # (prompt, completion, answer, score) of every row the task's reward saw

    def spied_addition():
        task = make_addition()
        reward = task.reward

        def spy(completions, prompts, **columns):
            scores = reward(completions, prompts=prompts, **columns)
            scored.extend(zip(prompts, completions, columns["answer"], scores))
            return scores

        task.reward = spy
        return task

    make_addition = TASKS["addition"]
    monkeypatch.setitem(TASKS, "addition", spied_addition)
    code = main(["--model_name_or_path", str(tiny_model_path("llama")), "--dataset_name", "addition",
                 "--output_dir", str(tmp_path / "run"), *TINY_RUN])  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["updates"] == 2 and summary["last_reward"] is not None
    assert 0.0 <= summary["last_reward"] <= 1.0
    assert len(scored) == 2 * 8  # two steps of 8 completions, each with its row's answer
    for prompt, completion, answer, score in scored:
        a, b = prompt.rstrip("=").split("+")
        assert answer == str(int(a) + int(b)) and score == float(completion.strip() == answer)


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "give --reward_funcs or --reward_model_name_or_path"),
        (["--reward_funcs", "nodots"], "must be an import path such as"),
    ],
)
def test_grpo_command_errors_name_the_flag(tmp_path, capsys, extra, message):
    Dataset.from_dict({"prompt": ["a b"] * 8}).to_json(str(tmp_path / "data.jsonl"))
    code = main(["--model_name_or_path", str(tiny_model_path("llama")),
                 "--dataset_name", str(tmp_path / "data.jsonl"), "--output_dir", str(tmp_path / "run"),
                 *extra, *TINY_RUN])  # fmt: skip
    assert code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_examples_script_is_the_command():
    script = Path(__file__).resolve().parents[2] / "examples" / "scripts" / "grpo.py"
    result = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--num_generations" in result.stdout and "--reward_funcs" in result.stdout


TRL1_FLAGS = [
    "--loss_type", "sapo", "--sapo_temperature_pos", "0.9", "--sapo_temperature_neg", "1.1",
    "--vespo_k_pos", "1.5", "--vespo_lambda_pos", "2.5", "--vespo_k_neg", "2.5", "--vespo_lambda_neg", "1.5",
    "--entropy_coef", "0.01", "--use_adaptive_entropy", "true", "--entropy_target", "50",
    "--entropy_coef_delta", "0.02", "--entropy_coef_min", "0.0", "--entropy_coef_max", "0.5",
    "--multi_objective_aggregation", "normalize_then_sum", "--off_policy_mask_threshold", "0.5",
    "--cast_lm_head_to_fp32", "true", "--pad_to_multiple_of", "8", "--cache_implementation", "static",
]  # fmt: skip


def test_trl1_grpo_fields_are_flags(tmp_path):
    from rlhfkit.commands._args import parse_args
    from rlhfkit.commands.grpo import GRPOScriptArguments
    from rlhfkit.trainers.grpo.config import GRPOConfig

    _, config = parse_args((GRPOScriptArguments, GRPOConfig), [*TRL1_FLAGS, "--output_dir", str(tmp_path)],
                           "test", "")  # fmt: skip
    assert (config.loss_type, config.sapo_temperature_pos, config.sapo_temperature_neg) == ("sapo", 0.9, 1.1)
    assert (config.vespo_k_pos, config.vespo_lambda_pos, config.vespo_k_neg, config.vespo_lambda_neg) == (
        1.5, 2.5, 2.5, 1.5,
    )  # fmt: skip
    assert config.entropy_coef == 0.01 and config.use_adaptive_entropy and config.entropy_target == 50
    assert (config.entropy_coef_delta, config.entropy_coef_min, config.entropy_coef_max) == (0.02, 0.0, 0.5)
    assert (
        config.multi_objective_aggregation == "normalize_then_sum" and config.off_policy_mask_threshold == 0.5
    )
    assert (
        config.cast_lm_head_to_fp32
        and config.pad_to_multiple_of == 8
        and config.cache_implementation == "static"
    )


def test_grpo_command_trains_with_the_trl1_flags(tmp_path, monkeypatch, capsys):
    (tmp_path / "trl1_rewards.py").write_text(
        "def has_e(prompts, completions, **columns):\n    return [float('e' in c) for c in completions]\n"
        "def length(prompts, completions, **columns):\n    return [float(len(c)) for c in completions]\n"
    )
    Dataset.from_dict({"prompt": ["the film was", "a story about"] * 4}).to_json(str(tmp_path / "data.jsonl"))
    monkeypatch.chdir(tmp_path)
    code = main([
        "--model_name_or_path", str(tiny_model_path("llama")), "--dataset_name", str(tmp_path / "data.jsonl"),
        "--output_dir", str(tmp_path / "run"), "--reward_funcs", "trl1_rewards.has_e", "trl1_rewards.length",
        "--num_iterations", "2", *TRL1_FLAGS, *TINY_RUN,
    ])  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["updates"] == 2
