"""Every trainer: a run killed with SIGKILL mid-training and resumed from its last checkpoint ends with the
weights of an uninterrupted run, bit for bit; and two fresh runs with the same seed agree (CPU determinism).

Each run is a child process (`resume_worker.py`): 4 steps (DDPO: epochs), a checkpoint every 2, the killed
run dies inside step 3, so the resumed run redoes step 3 from checkpoint-2.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.trainers.common.checkpointing import latest_checkpoint

WORKER = Path(__file__).with_name("resume_worker.py")
TRAINERS = ["ppo", "rloo", "grpo", "reward", "sft", "dpo", "ddpo"]


def _worker(name: str, root: Path, mode: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    return subprocess.run(
        [sys.executable, str(WORKER), name, str(root), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _assert_same_weights(expected: dict, got: dict, what: str) -> None:
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), f"{what}: {key} differs"


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINERS)
def test_sigkill_then_resume_matches_uninterrupted_run(name, tmp_path):
    full = _worker(name, tmp_path, "full")
    assert full.returncode == 0, full.stderr[-3000:]
    a = load_file(str(tmp_path / "a" / "final.safetensors"))
    b = load_file(str(tmp_path / "b" / "final.safetensors"))
    _assert_same_weights(a, b, "two fresh runs with one seed")

    killed = _worker(name, tmp_path, "kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    checkpoints = tmp_path / "cut" / ("checkpoints" if name == "ddpo" else "")
    assert latest_checkpoint(checkpoints).name == "checkpoint-2"  # the step-3 state never reached disk
    assert not (tmp_path / "cut" / "final.safetensors").exists()

    resumed = _worker(name, tmp_path, "resume")  # also takes over the killed run's stale lock
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_same_weights(
        a, load_file(str(tmp_path / "cut" / "final.safetensors")), "resumed vs uninterrupted"
    )
    assert latest_checkpoint(checkpoints).name == "checkpoint-4"
