"""The example scripts run as documented, with tiny budgets (subprocesses, offline)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfkit.testing import tiny_model_path

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("reward", ["task", "model"])
def test_ppo_example_trains_and_saves(tmp_path, reward):
    extra = ["--reward_model", str(tiny_model_path("llama-reward"))] if reward == "model" else []
    out = tmp_path / "model"
    proc = _run(
        "examples/ppo.py", "--steps", "2", "--batch_size", "8", "--output_dir", str(out), *extra, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step   2" in proc.stdout
    assert (out / "value_head.safetensors").is_file()
