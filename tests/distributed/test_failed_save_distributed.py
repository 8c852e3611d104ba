"""A checkpoint save that fails on one of 2 gloo processes: every process raises at once (no waiting for the
collective timeout), the failing one its own error and the other a CheckpointWriteError naming it; nothing
half-written is published and the previous checkpoint stays intact."""

from __future__ import annotations

import pytest
import torch
from launch import launch
from safetensors.torch import load_file

from rlhfkit.trainers.common.checkpointing import WEIGHTS_FILE, list_checkpoints, verify_checkpoint


@pytest.mark.slow
def test_a_failed_write_on_one_process_makes_every_process_raise(tmp_path):
    r0, r1 = launch("failed_save_worker.py", str(tmp_path), timeout=240)
    for phase, failing in (("start", 0), ("add", 1), ("publish", 0)):
        own, other = (r0, r1) if failing == 0 else (r1, r0)
        assert own[phase] == {"type": "OSError", "message": f"[Errno 5] disk error on process {failing}"}, (
            phase
        )
        assert other[phase]["type"] == "CheckpointWriteError", phase
        assert f"process(es) [{failing}] failed" in other[phase]["message"]
        assert "previous checkpoint is intact" in other[phase]["message"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-1", "checkpoint-5"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".checkpoint")] == []  # no staging left
    for name in ("checkpoint-1", "checkpoint-5"):
        verify_checkpoint(tmp_path / name)
    first, last = (
        load_file(str(tmp_path / name / WEIGHTS_FILE))["weight"] for name in ("checkpoint-1", "checkpoint-5")
    )
    torch.testing.assert_close(last - first, torch.ones_like(first))  # checkpoint-1 kept the weights it had


@pytest.mark.slow
def test_a_trainer_checkpoint_failing_on_one_process_stops_both_at_once():
    """The HF-Trainer checkpoint path (RLOO, GRPO, SFT, DPO, Reward): rank 1 fails, rank 0 learns it
    at once."""
    r0, r1 = launch("trainer_failed_save_worker.py", timeout=240)
    assert r1["type"] == "OSError" and "disk error on process 1" in r1["message"]
    assert r0["type"] == "CheckpointWriteError" and "process(es) [1] failed" in r0["message"]
    kept = [name for name in r0["listing"] if name != ".rlhfkit.lock"]  # the run's lock, held until it exits
    assert kept == ["checkpoint-1"], r0["listing"]  # no checkpoint-2, no staging folder left
