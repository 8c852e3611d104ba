"""`rlhfkit ppo` end to end: a subprocess run with a tiny budget, checkpoint + resume, a local reward model,
and clear errors for bad flags."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlhfkit.commands import ppo as ppo_command
from rlhfkit.testing import tiny_model_path

TINY = ["--batch_size", "4", "--mini_batch_size", "2", "--ppo_epochs", "1", "--max_new_tokens", "4"]


def run_cli(*args: str, cwd) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
    }
    return subprocess.run(
        [sys.executable, "-m", "rlhfkit", "ppo", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def summary(result: subprocess.CompletedProcess) -> dict:
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_cli_trains_saves_checkpoints_and_resumes(tmp_path):
    # first run: local prompts scored by a local reward model, a checkpoint after every step
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"The film number {i} was"}) for i in range(6)))
    out = tmp_path / "out"
    first = run_cli(
        "--dataset_name",
        str(data),
        "--reward",
        str(tiny_model_path("llama-reward")),
        "--steps",
        "3",
        "--save_steps",
        "1",
        "--save_total_limit",
        "2",
        "--output_dir",
        str(out),
        *TINY,
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert summary(first)["steps"] == 3
    assert "step 3/3: mean score" in first.stdout
    assert (out / "value_head.safetensors").is_file() and (out / "README.md").is_file()
    # one checkpoint-<step> per step, the oldest pruned by --save_total_limit 2
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    assert (out / "checkpoint-3" / "trainer_state.json").is_file()

    # second run: the built-in task and its reward, continuing from the newest checkpoint of the output folder
    resumed = run_cli(
        "--steps",
        "4",
        "--resume_from_checkpoint",
        str(out),
        "--output_dir",
        str(tmp_path / "out2"),
        *TINY,
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step 4/4" in resumed.stdout and "step 3/4" not in resumed.stdout  # continued, not restarted
    assert summary(resumed)["steps"] == 4


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dataset_name", "no-such-task"], "built-in task"),
        (["--model_name_or_path", "/no/such/model"], "not a local folder"),
        (["--reward", "/no/such/reward"], "--reward"),
        (["--batch_size", "6", "--mini_batch_size", "4"], "divisible"),
        (["--dataset_name", "addition"], "--dataset_name 'addition'"),  # scored against a column, not text
    ],
)
def test_cli_bad_flags_fail_with_a_clear_message(argv, message, capsys, tmp_path):
    assert ppo_command.main([*argv, "--output_dir", str(tmp_path / "o"), "--steps", "1"]) == 2
    assert message in capsys.readouterr().err


def test_cli_help_lists_ppo_and_script_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        ppo_command.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--model_name_or_path",
        "--dataset_name",
        "--reward",
        "--output_dir",
        "--steps",
        "--init_kl_coef",
    ):
        assert flag in text
