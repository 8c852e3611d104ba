"""Each process keeps its own random state in a checkpoint (`rng_state_<rank>`): a 2-process PPO run (gloo,
DDP) saved after step 1 and resumed for step 2 samples what the uninterrupted run sampled, rank by rank, and
ends with its exact weights. A checkpoint resumed on another number of processes says so."""

import json

import pytest
import torch
from launch import launch
from workers.rl_fixtures import ppo_trainer

from rlhfkit.trainers.common import checkpointing
from rlhfkit.trainers.common.checkpointing import (
    MANIFEST_FILE,
    load_state,
    rng_state,
    save_training_checkpoint,
)


@pytest.mark.slow
def test_ppo_resumed_on_two_processes_repeats_the_uninterrupted_run(tmp_path):
    r0, r1 = launch("ppo_rng_worker.py", str(tmp_path))
    assert r0["world"] == 2
    assert r0["first"] != r1["first"] and r0["continued"] != r1["continued"]  # the ranks sample differently
    for r in (r0, r1):
        assert r["resumed"] == r["continued"]  # each rank took back its own random state
        assert r["resumed_step"] == 2 and r["moved_in_step_2"] > 1e-4
        assert r["resumed_minus_continued"] == 0.0
    checkpoint = tmp_path / "checkpoint"
    listed = json.loads((checkpoint / MANIFEST_FILE).read_text())["files"]
    assert {f"rng_state_{rank}.{ext}" for rank in (0, 1) for ext in ("json", "safetensors")} <= set(listed)
    assert load_state(checkpoint, "trainer_state")["num_processes"] == 2
    # one process resumes it too: with the state of process 0, and a warning naming the situation
    single = ppo_trainer(batch_size=2, adam=True)
    with pytest.warns(UserWarning, match=r"state of 2 process\(es\) and is resumed on 1: processes 0\.\.0"):
        single.load_checkpoint(str(checkpoint))
    assert torch.equal(torch.get_rng_state(), load_state(checkpoint, "rng_state_0")["torch"])
    assert single.current_step == 1


def _single_process_checkpoint(tmp_path):
    torch.manual_seed(5)
    saved = rng_state()["torch"]
    folder = save_training_checkpoint(tmp_path / "checkpoint-1", 1, {"w": torch.zeros(1)}, {})
    torch.manual_seed(6)
    return folder, saved


def test_one_process_checkpoint_keeps_its_files_and_restores_its_state(tmp_path):
    folder, saved = _single_process_checkpoint(tmp_path)
    assert not list(folder.glob("rng_state_*"))  # one process: its state is in trainer_state, as before
    checkpointing.load_training_checkpoint(folder, {})
    assert torch.equal(torch.get_rng_state(), saved)


@pytest.mark.parametrize("rank", [0, 1])
def test_one_process_checkpoint_resumed_on_two(rank, tmp_path, monkeypatch, recwarn):
    """Process 0 takes back the saved state; process 1 has none saved and keeps its own (seeded) one, rather
    than drawing the same numbers as process 0. Only process 0 warns."""
    folder, saved = _single_process_checkpoint(tmp_path)
    own = torch.get_rng_state()
    monkeypatch.setattr(checkpointing, "process_rank", lambda: (rank, 2))
    checkpointing.load_training_checkpoint(folder, {})
    assert torch.equal(torch.get_rng_state(), saved if rank == 0 else own)
    warned = [str(w.message) for w in recwarn if "resumed on 2" in str(w.message)]
    assert len(warned) == (rank == 0) and all("random state of 1 process(es)" in m for m in warned)
