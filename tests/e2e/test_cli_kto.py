"""`rlhfkit kto` end to end: a YAML-configured subprocess run that learns, and clear errors for bad data."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlhfkit.commands.kto import main
from rlhfkit.testing import tiny_model_path


def _write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.mark.slow
def test_kto_command_subprocess_with_yaml_learns(tmp_path):
    rows = [
        {"prompt": f"Q{i}: ", "completion": "yes good" if i % 2 == 0 else "no bad", "label": i % 2 == 0}
        for i in range(16)
    ]
    data = _write_jsonl(tmp_path / "rows.jsonl", rows)
    config = tmp_path / "kto.yaml"
    config.write_text(
        "beta: 0.5\nmax_steps: 6\nper_device_train_batch_size: 8\nlearning_rate: 0.002\nmax_length: 32\n"
    )
    out = tmp_path / "kto"
    cmd = [
        sys.executable, "-m", "rlhfkit", "kto", "--config", str(config),
        "--model_name_or_path", str(tiny_model_path("llama")), "--dataset_name", str(data),
        "--output_dir", str(out), "--use_cpu", "--report_to", "none", "--save_strategy", "no",
        "--logging_steps", "1", "--disable_tqdm", "true",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    last = json.loads(result.stdout.strip().splitlines()[-1])["last_log"]
    assert last["step"] == 6
    # the desirable completions rose above the reference, the undesirable ones fell below it
    assert last["rewards/chosen"] > 0 > last["rewards/rejected"]
    assert (out / "model.safetensors").exists()
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"


def _run(tmp_path, data, *flags):
    return main(
        [
            "--model_name_or_path", str(tiny_model_path("llama")), "--dataset_name", str(data),
            "--output_dir", str(tmp_path / "o"), "--use_cpu", "--report_to", "none", *flags,
        ]
    )  # fmt: skip


def test_kto_command_bad_data_and_flags(tmp_path, capsys):
    unlabelled = _write_jsonl(tmp_path / "unlabelled.jsonl", [{"prompt": "q", "completion": "a"}] * 3)
    assert _run(tmp_path, unlabelled) == 2
    assert "no 'label' column" in capsys.readouterr().err
    labelled = _write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "q", "completion": "a", "label": True}] * 3)
    assert _run(tmp_path, labelled, "--loss_type", "sigmoid") == 2
    assert "loss_type must be one of ['apo_zero_unpaired', 'kto']" in capsys.readouterr().err
    assert _run(tmp_path, labelled, "--per_device_train_batch_size", "1") == 2
    assert "per_device_train_batch_size must be at least 2" in capsys.readouterr().err


def test_trl_example_script_path_takes_the_same_flags():
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples/scripts/kto.py"
    result = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--desirable_weight" in result.stdout and "--loss_type" in result.stdout
