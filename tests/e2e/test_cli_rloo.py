"""`rlhfkit rloo` end to end: a subprocess run on a built-in task, a local dataset with a local reward
model (TRL 0.x's flags), and the offline error for hub-only names."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlhfkit.commands.rloo import main
from rlhfkit.testing import tiny_model_path

TINY_RUN = [
    "--per_device_train_batch_size",
    "4",
    "--gradient_accumulation_steps",
    "1",
    "--total_episodes",
    "8",
    "--response_length",
    "4",
    "--num_ppo_epochs",
    "1",
    "--report_to",
    "none",
    "--use_cpu",
    "--logging_steps",
    "1",
    "--save_strategy",
    "no",
    "--disable_tqdm",
    "true",
]


@pytest.mark.slow
def test_rloo_command_in_a_subprocess_with_a_yaml_config(tmp_path):
    config = tmp_path / "rloo.yaml"
    config.write_text(
        f"model_name_or_path: {tiny_model_path('llama')}\nnum_sample_generations: 1\nkl_coef: 0.03\n"
    )
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlhfkit",
            "rloo",
            "--config",
            str(config),
            "--dataset_name",
            "keyword",
            "--output_dir",
            str(out),
            "--missing_eos_penalty",
            "1.0",
            "--stop_token",
            "eos",
            *TINY_RUN,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 updates, 8 episodes" in result.stdout
    assert (out / "model.safetensors").exists() and (out / "README.md").exists()
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and samples[0]["step"] == 2  # 4 test prompts shown once, after the last update
    assert "KL coefficient: 0.03" in (out / "README.md").read_text()  # the YAML value reached the config


def test_rloo_command_with_local_data_and_reward_model(tmp_path, capsys):
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"Say something about item {i}:"}) + "\n" for i in range(8))
    )
    policy = str(tiny_model_path("llama"))
    code = main(
        [
            "--dataset_name",
            str(data),
            "--dataset_train_split",
            "train",
            "--dataset_test_split",
            "validation",
            "--model_name_or_path",
            policy,
            "--sft_model_path",
            policy,
            "--reward_model_path",
            str(tiny_model_path("llama-reward")),
            "--output_dir",
            str(tmp_path / "run"),
            "--learning_rate",
            "3e-6",
            "--num_mini_batches",
            "2",
            "--local_rollout_forward_batch_size",
            "4",
            "--missing_eos_penalty",
            "1.0",
            "--stop_token",
            "eos",
            "--kl_coef",
            "0.03",
            "--num_sample_generations",
            "0",
            "--per_device_train_batch_size",
            "4",
            "--gradient_accumulation_steps",
            "1",
            "--total_episodes",
            "16",
            "--response_length",
            "4",
            "--num_ppo_epochs",
            "2",
            "--report_to",
            "none",
            "--use_cpu",
            "--logging_steps",
            "1",
            "--save_strategy",
            "no",
            "--disable_tqdm",
            "true",
        ]
    )
    assert code == 0
    assert "2 updates, 16 episodes" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--dataset_name", "trl-internal-testing/descriptiveness-sentiment-trl-style"], "offline"),
        (["--dataset_name", "keyword", "--reward_model_path", "EleutherAI/pythia-14m"], "not a local folder"),
        (["--dataset_name", "keyword", "--rloo_k", "3"], "rloo_k"),
        (["--dataset_name", "addition"], "--dataset_name 'addition'"),
    ],
)
def test_rloo_command_explains_bad_input(tmp_path, capsys, flags, message):
    code = main(
        [
            *flags,
            "--model_name_or_path",
            str(tiny_model_path("llama")),
            "--output_dir",
            str(tmp_path),
            "--report_to",
            "none",
            "--use_cpu",
        ]
    )
    assert code == 2
    assert message in capsys.readouterr().err


CURRENT_RUN = ["--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length",
               "4", "--max_steps", "2", "--report_to", "none", "--use_cpu", "--logging_steps", "1",
               "--save_strategy", "no", "--disable_tqdm", "true"]  # fmt: skip


def test_current_form_flags_train_with_import_path_rewards(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_rewards.py").write_text(
        "def has_e(prompts, completions, **columns):\n    return [float('e' in c) for c in completions]\n"
    )
    monkeypatch.chdir(tmp_path)
    code = main([
        "--model_name_or_path", str(tiny_model_path("llama")), "--dataset_name", "keyword",
        "--output_dir", str(tmp_path / "run"), "--reward_funcs", "my_rewards.has_e", "--beta", "0.1",
        "--normalize_advantages", "true", "--reward_clip_range", "-1", "1", *CURRENT_RUN,
    ])  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["updates"] == 2 and summary["last_reward"] is not None
    assert (tmp_path / "run" / "model.safetensors").exists()


def test_flags_of_both_forms_are_refused_naming_them(tmp_path, capsys):
    code = main([
        "--model_name_or_path", str(tiny_model_path("llama")), "--dataset_name", "keyword",
        "--output_dir", str(tmp_path / "run"), "--rloo_k", "4", *CURRENT_RUN,
    ])  # fmt: skip
    assert code == 2
    assert "rloo_k belongs to the classic form" in capsys.readouterr().err
