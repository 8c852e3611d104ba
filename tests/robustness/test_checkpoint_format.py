"""The checkpoint format: checksums catch damage, resume falls back, a full disk and a second run are
refused."""

from __future__ import annotations

import errno
import json
import os
import random
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from rlhfkit.trainers.common import checkpointing
from rlhfkit.trainers.common.checkpointing import (
    LOCK_FILE,
    CheckpointError,
    CheckpointLockError,
    CheckpointWriteError,
    latest_checkpoint,
    load_state,
    lock_output_dir,
    prune_checkpoints,
    rng_state,
    save_state,
    set_rng_state,
    verify_checkpoint,
    write_checkpoint,
)


def _save(root, step, value=None):
    def write(folder):
        save_file(
            {"w": torch.full((64,), float(step if value is None else value))},
            str(folder / "model.safetensors"),
        )
        (folder / "trainer_state.json").write_text(json.dumps({"step": step}))

    return write_checkpoint(root / f"checkpoint-{step}", write, step)


def test_manifest_records_every_file_and_verifies(tmp_path):
    folder = _save(tmp_path, 3)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["step"] == 3 and manifest["format_version"] == checkpointing.FORMAT_VERSION
    assert sorted(manifest["files"]) == ["model.safetensors", "trainer_state.json"]
    assert manifest["files"]["trainer_state.json"]["size"] == len(json.dumps({"step": 3}))
    assert verify_checkpoint(folder) == folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3"]  # no staging folder left


def test_truncated_file_is_named(tmp_path):
    folder = _save(tmp_path, 1)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"model\.safetensors' is truncated or altered: \d+ bytes"):
        verify_checkpoint(folder)


def test_altered_file_of_the_same_size_is_named(tmp_path):
    folder = _save(tmp_path, 1)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped byte inside a tensor: still a valid safetensors file
    weights.write_bytes(bytes(data))
    assert load_file(str(weights))["w"].shape == (64,)
    with pytest.raises(CheckpointError, match=r"model\.safetensors' was altered: its sha256"):
        verify_checkpoint(folder)
    other = _save(tmp_path, 2)
    (other / "trainer_state.json").unlink()
    with pytest.raises(CheckpointError, match=r"trainer_state\.json' is missing"):
        verify_checkpoint(other)


def test_latest_checkpoint_falls_back_to_the_previous_intact_one(tmp_path):
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    newest = _save(tmp_path, 3)
    (newest / "trainer_state.json").write_text('{"step": 4}')  # same size, other content
    with pytest.warns(UserWarning, match="skipping damaged checkpoint .*checkpoint-3"):
        assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-2"
    assert checkpointing.resolve_checkpoint(tmp_path) == tmp_path / "checkpoint-2"


def test_full_disk_keeps_the_previous_checkpoint_and_says_so(tmp_path, monkeypatch):
    _save(tmp_path, 1, value=1.0)
    real_save_file = save_file

    def full_disk(*args, **kwargs):
        real_save_file(*args, **kwargs)  # part of the data reached the disk ...
        raise OSError(errno.ENOSPC, "No space left on device")  # ... then it filled up

    monkeypatch.setattr(sys.modules[__name__], "save_file", full_disk)
    with pytest.raises(
        CheckpointWriteError, match="no space left .*checkpoint-2.*previous checkpoint is intact"
    ):
        _save(tmp_path, 2)
    with pytest.raises(CheckpointWriteError, match="no space left .*checkpoint-1"):
        _save(tmp_path, 1, value=5.0)  # replacing an existing folder: the old one stays
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]  # staging folders removed
    assert load_file(str(tmp_path / "checkpoint-1" / "model.safetensors"))["w"][0].item() == 1.0
    assert latest_checkpoint(tmp_path) == verify_checkpoint(tmp_path / "checkpoint-1")


def test_full_disk_while_writing_the_manifest(tmp_path, monkeypatch):
    _save(tmp_path, 1)

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpointing, "write_manifest", full_disk)
    with pytest.raises(CheckpointWriteError, match="no space left"):
        _save(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]


def test_other_errors_pass_through_unchanged(tmp_path):
    def write(folder):
        raise PermissionError(errno.EACCES, "denied")

    with pytest.raises(PermissionError):
        write_checkpoint(tmp_path / "checkpoint-1", write, 1)
    assert list(tmp_path.iterdir()) == []


def test_retention_keeps_the_newest_and_the_protected(tmp_path):
    for step in (1, 2, 3, 10, 20):
        _save(tmp_path, step)
    prune_checkpoints(tmp_path, 2, protect=(str(tmp_path / "checkpoint-1"),))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-1",
        "checkpoint-20",
    ]  # the limit counts the protected
    prune_checkpoints(tmp_path, None)  # None keeps everything
    prune_checkpoints(tmp_path, 1)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-20"]


def test_lock_held_by_a_live_process_names_it(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname()}))
        with pytest.raises(CheckpointLockError, match=rf"in use by another run \(pid {sleeper.pid} on host"):
            lock_output_dir(tmp_path)
        with pytest.raises(
            CheckpointLockError, match=f"pid {sleeper.pid}"
        ):  # every trainer saves through this
            checkpointing.save_training_checkpoint(tmp_path / "checkpoint-1", 1, {"w": torch.zeros(1)}, {})
        assert not (tmp_path / "checkpoint-1").exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_lock_on_another_host_is_respected(tmp_path):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "elsewhere.example"}))
    with pytest.raises(CheckpointLockError, match="pid 1 on host elsewhere.example"):
        lock_output_dir(tmp_path)


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    with pytest.warns(UserWarning, match=f"stale lock .* process {dead.pid}"):
        lock = lock_output_dir(tmp_path)
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert lock_output_dir(tmp_path) == lock  # taking it again in the same process is fine
    (tmp_path / LOCK_FILE).write_text("{")  # a lock half-written by a crash counts as stale
    with pytest.warns(UserWarning, match="stale lock"):
        lock_output_dir(tmp_path)


def test_state_round_trip_needs_no_pickle(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    state = {
        "optimizer": optimizer.state_dict(),
        "moments": (1.5, 2),
        "none": None,
        "arr": np.arange(3, dtype=np.int16),
    }
    save_state(tmp_path, "s", state)
    back = load_state(tmp_path, "s")
    assert back["moments"] == (1.5, 2) and back["none"] is None and back["arr"].dtype == np.int16
    restored = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters(), lr=0.5)
    restored.load_state_dict(back["optimizer"])
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(restored.state_dict()["state"][0][key], optimizer.state_dict()["state"][0][key])
    assert restored.param_groups[0]["lr"] == 0.1 and restored.param_groups[0]["betas"] == (0.9, 0.999)
    with pytest.raises(TypeError, match="cannot store a object"):
        save_state(tmp_path, "bad", {"x": object()})


def test_rng_of_every_generator_round_trips_through_json(tmp_path):
    own = torch.Generator().manual_seed(5)
    save_state(tmp_path, "rng", rng_state({"sampler": own}))
    expected = (random.random(), np.random.rand(), torch.rand(2), torch.rand(2, generator=own))
    random.random(), np.random.rand(), torch.rand(3), torch.rand(3, generator=own)  # move every stream on
    set_rng_state(load_state(tmp_path, "rng"), {"sampler": own})
    got = (random.random(), np.random.rand(), torch.rand(2), torch.rand(2, generator=own))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2]) and torch.equal(got[3], expected[3])
