"""`rlhfkit dpo` end to end: a subprocess run with a YAML config, and clear errors for bad data."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlhfkit.commands.dpo import main
from rlhfkit.testing import tiny_model_path


def _write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.mark.slow
def test_dpo_command_subprocess_with_yaml(tmp_path):
    rows = [{"prompt": f"Q{i}: ", "chosen": "yes good", "rejected": "no bad"} for i in range(8)]
    data = _write_jsonl(tmp_path / "pairs.jsonl", rows)
    config = tmp_path / "dpo.yaml"
    config.write_text("loss_type: ipo\nbeta: 0.5\nmax_steps: 2\nper_device_train_batch_size: 4\n")
    out = tmp_path / "dpo"
    cmd = [
        sys.executable,
        "-m",
        "rlhfkit",
        "dpo",
        "--config",
        str(config),
        "--model_name_or_path",
        str(tiny_model_path("llama")),
        "--dataset_name",
        str(data),
        "--output_dir",
        str(out),
        "--use_cpu",
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        "--logging_steps",
        "1",
        "--disable_tqdm",
        "true",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["last_log"]["step"] == 2 and "rewards/margins" in summary["last_log"]
    assert (out / "model.safetensors").exists()
    saved = json.loads((out / "config.json").read_text())
    assert saved["model_type"] == "llama"


def test_dpo_command_bad_data(tmp_path, capsys):
    same = _write_jsonl(tmp_path / "same.jsonl", [{"prompt": "q", "chosen": "a", "rejected": "a"}] * 3)
    code = main(
        [
            "--model_name_or_path",
            str(tiny_model_path("llama")),
            "--dataset_name",
            str(same),
            "--output_dir",
            str(tmp_path / "o"),
            "--use_cpu",
            "--report_to",
            "none",
        ]
    )
    assert code == 2 and "identical in every one" in capsys.readouterr().err
    code = main(
        [
            "--model_name_or_path",
            str(tiny_model_path("llama")),
            "--dataset_name",
            str(same),
            "--output_dir",
            str(tmp_path / "o"),
            "--use_cpu",
            "--loss_type",
            "bogus",
        ]
    )
    assert code == 2 and "loss_type" in capsys.readouterr().err
    missing = tmp_path / "missing.yaml"
    with pytest.raises(SystemExit):
        main(["--config", str(missing)])
