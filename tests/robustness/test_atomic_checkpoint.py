"""Checkpoints appear atomically: a process killed mid-save leaves the previous checkpoint loadable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlhfkit.trainers.common.checkpointing import (
    atomic_directory,
    latest_checkpoint,
    publish_directory,
    write_manifest,
)

# Child process: replaces `final` with a ~40 MB checkpoint, announces it is half-way, then waits to be killed.
_SLOW_SAVER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import torch
    from safetensors.torch import save_file
    from rlhfkit.trainers.common.checkpointing import atomic_directory

    final, started = Path(sys.argv[1]), Path(sys.argv[2])
    with atomic_directory(final) as tmp:
        save_file({"w": torch.full((10_000_000,), 2.0)}, str(tmp / "model.safetensors"))
        started.write_text("half-way")
        while True:  # "still writing the optimizer state" until SIGKILL arrives
            time.sleep(0.05)
    """
)


def _save(folder: Path, value: float) -> None:
    with atomic_directory(folder) as tmp:
        save_file({"w": torch.full((4,), value)}, str(tmp / "model.safetensors"))
        (tmp / "step.txt").write_text(str(value))
        write_manifest(tmp, int(value))  # latest_checkpoint takes only folders with a manifest


@pytest.mark.slow
def test_sigkill_mid_save_leaves_previous_checkpoint_loadable(tmp_path):
    final = tmp_path / "checkpoint-1"
    _save(final, 1.0)
    started = tmp_path / "started"
    child = subprocess.Popen([sys.executable, "-c", _SLOW_SAVER, str(final), str(started)])
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert child.poll() is None, "the saving process died before it was killed"
            assert time.monotonic() < deadline, "the saving process never got half-way"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    # the old checkpoint is intact; the half-written one is only a dot-named temp folder
    assert load_file(str(final / "model.safetensors"))["w"].tolist() == [1.0] * 4
    assert (final / "step.txt").read_text() == "1.0"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".checkpoint-1.tmp-")]
    assert latest_checkpoint(tmp_path) == final
    # the next save still works and cleans nothing it should not
    _save(final, 3.0)
    assert load_file(str(final / "model.safetensors"))["w"].tolist() == [3.0] * 4


def test_exception_inside_save_keeps_old_and_removes_temp(tmp_path):
    final = tmp_path / "ckpt"
    _save(final, 1.0)
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_directory(final) as tmp:
            (tmp / "model.safetensors").write_bytes(b"partial")
            raise RuntimeError("disk full")
    assert load_file(str(final / "model.safetensors"))["w"].tolist() == [1.0] * 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_crash_between_the_two_renames_is_undone(tmp_path):
    # publish_directory moves the old folder aside, then moves the new one in; a crash in between leaves
    # only `.ckpt.old-<pid>`. The next reader or writer puts it back.
    final = tmp_path / "checkpoint-7"
    _save(final, 7.0)
    os.replace(final, tmp_path / ".checkpoint-7.old-12345")
    assert latest_checkpoint(tmp_path) == final
    assert (final / "step.txt").read_text() == "7.0"


def test_publish_directory_replaces_existing(tmp_path):
    _save(tmp_path / "a", 1.0)
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "step.txt").write_text("2")
    publish_directory(staged, tmp_path / "a")
    assert (tmp_path / "a" / "step.txt").read_text() == "2"
    assert not (tmp_path / "a" / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_latest_checkpoint_orders_by_step_not_by_name(tmp_path):
    assert latest_checkpoint(tmp_path / "missing") is None
    assert latest_checkpoint(tmp_path) is None
    for step in (2, 10, 9):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "step.txt").write_text(str(step))
        write_manifest(tmp_path / f"checkpoint-{step}", step)
    (tmp_path / ".checkpoint-11.tmp-abc").mkdir()  # unfinished save: ignored
    (tmp_path / "checkpoint-final").mkdir()  # not a step folder: ignored
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-10"
