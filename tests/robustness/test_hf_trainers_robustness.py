"""Reward / SFT / DPO / KTO trainers: SIGINT saves a checkpoint and stops; resuming gives the uninterrupted
run's numbers bit for bit; a NaN loss skips the step and names the cause."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from transformers import TrainerCallback
from workers.hf_fixtures import build, flat_params

from rlhfkit.trainers.common.checkpointing import latest_checkpoint
from rlhfkit.trainers.common.guards import NonFiniteStepWarning

NAMES = ["reward", "sft", "dpo", "kto"]


class _At(TrainerCallback):
    def __init__(self, step, action):
        self.step, self.action = step, action

    def on_step_begin(self, args, state, control, **kw):
        if state.global_step + 1 == self.step:
            self.action()


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_sigint_then_resume_continues_exactly(name, tmp_path):
    kw = dict(per_device=2, max_steps=4, save_strategy="steps", save_steps=100, learning_rate=0.05)
    full = build(name, str(tmp_path / "full"), **kw)
    full.train()
    cut = build(name, str(tmp_path / "cut"), **kw)
    cut.add_callback(_At(2, lambda: os.kill(os.getpid(), signal.SIGINT)))  # arrives during step 2
    cut.train()
    assert cut.stopped_by_signal and cut.state.global_step == 2
    assert latest_checkpoint(tmp_path / "cut") == tmp_path / "cut" / "checkpoint-2"
    resumed = build(name, str(tmp_path / "cut"), **kw)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 4
    torch.testing.assert_close(flat_params(resumed.model), flat_params(full.model), rtol=0, atol=0)
    full_losses = [h["loss"] for h in full.state.log_history if "loss" in h]
    resumed_losses = [h["loss"] for h in resumed.state.log_history if "loss" in h]
    assert resumed_losses[-2:] == full_losses[-2:]


@pytest.mark.parametrize("name", NAMES)
def test_nan_loss_skips_the_step(name, tmp_path):
    trainer = build(name, str(tmp_path), per_device=2, max_steps=3)
    poison = {"on": False}

    def make_nan(module, inputs, output):
        if poison["on"]:
            output.logits = output.logits * float("nan")
            if getattr(output, "loss", None) is not None:  # SFT: the model computed its loss already
                output.loss = output.loss * float("nan")
        return output

    trainer.model.register_forward_hook(make_nan)
    snapshots = []

    class _Snap(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            poison["on"] = state.global_step == 1  # the second step sees NaN logits
            snapshots.append(flat_params(trainer.model))

    trainer.add_callback(_Snap())
    with pytest.warns(NonFiniteStepWarning, match=r"skipped step 2: non-finite loss, gradients"):
        trainer.train()
    snapshots.append(flat_params(trainer.model))
    moved = [not torch.equal(a, b) for a, b in zip(snapshots, snapshots[1:])]
    assert moved == [True, False, True]
    assert trainer.nonfinite_guard.skipped == 1
    assert torch.isfinite(snapshots[-1]).all()


def test_checkpoint_failures_through_the_trainer(tmp_path, monkeypatch):
    """A damaged newest checkpoint is skipped on resume; a full disk keeps the last one;
    a live lock refuses."""
    import errno
    import json
    import socket
    import subprocess
    import sys

    from transformers import Trainer

    from rlhfkit.trainers.common.checkpointing import LOCK_FILE, CheckpointLockError, CheckpointWriteError

    kw = dict(per_device=2, max_steps=4, save_strategy="steps", save_steps=2)
    full = build("sft", str(tmp_path / "full"), **kw)
    full.train()
    weights = tmp_path / "full" / "checkpoint-4" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    resumed = build("sft", str(tmp_path / "full"), **kw)
    with pytest.warns(UserWarning, match="skipping damaged checkpoint .*checkpoint-4"):
        resumed.train(resume_from_checkpoint=True)  # from checkpoint-2: steps 3 and 4 again
    assert torch.equal(flat_params(resumed.model), flat_params(full.model))

    original, calls = Trainer._save_rng_state, []

    def full_disk_on_second_save(self, output_dir):
        calls.append(output_dir)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_rng_state", full_disk_on_second_save)
    cut = build("sft", str(tmp_path / "cut"), **kw)
    with pytest.raises(
        CheckpointWriteError, match="no space left .*checkpoint-4.*previous checkpoint is intact"
    ):
        cut.train()
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == [
        LOCK_FILE,
        "checkpoint-2",
    ]  # no staging left
    assert latest_checkpoint(tmp_path / "cut") == tmp_path / "cut" / "checkpoint-2"

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "locked").mkdir()
        (tmp_path / "locked" / LOCK_FILE).write_text(
            json.dumps({"pid": sleeper.pid, "host": socket.gethostname()})
        )
        with pytest.raises(CheckpointLockError, match=f"pid {sleeper.pid}"):
            build("sft", str(tmp_path / "locked"), **kw).train()
    finally:
        sleeper.kill()
        sleeper.wait()
