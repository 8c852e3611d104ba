"""`rlhfkit reward` end to end: a subprocess LoRA run from a YAML config, and clear errors for bad data."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlhfkit.commands.reward import main
from rlhfkit.testing import tiny_model_path


def _write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.mark.slow
def test_reward_command_subprocess_lora_with_yaml(tmp_path):
    data = _write_jsonl(
        tmp_path / "pairs.jsonl",
        [{"prompt": "Q: ", "chosen": f"excellent {i}", "rejected": f"terrible {i}"} for i in range(8)],
    )
    config = tmp_path / "reward.yaml"
    config.write_text(f"model_name_or_path: {tiny_model_path('llama-reward')}\nmax_steps: 2\nlora_r: 4\n")
    out = tmp_path / "rm"
    cmd = [
        sys.executable,
        "-m",
        "rlhfkit",
        "reward",
        "--config",
        str(config),
        "--dataset_name",
        str(data),
        "--output_dir",
        str(out),
        "--use_peft",
        "--per_device_train_batch_size",
        "4",
        "--use_cpu",
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        "--disable_tqdm",
        "true",
        "--max_steps",
        "1",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["overlong"]["train_dataset"] == {"dropped": 0, "truncated": 0}
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()
    args = json.loads((out / "adapter_config.json").read_text())
    assert args["r"] == 4 and args["task_type"] == "SEQ_CLS"  # lora_r came from the YAML file


def test_reward_command_bad_data_errors(tmp_path, capsys):
    model = str(tiny_model_path("llama-reward"))
    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"good": "a", "bad": "b"}])
    code = main(
        [
            "--model_name_or_path",
            model,
            "--dataset_name",
            str(bad),
            "--output_dir",
            str(tmp_path / "o"),
            "--use_cpu",
            "--report_to",
            "none",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "needs the columns" in err and "chosen" in err
    code = main(
        [
            "--model_name_or_path",
            model,
            "--dataset_name",
            "org/some-hub-dataset",
            "--output_dir",
            str(tmp_path / "o"),
            "--use_cpu",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "offline" in err and "local" in err
