"""A full disk, however the writer reports it (OSError ENOSPC, safetensors' SafetensorError, torch's
"unexpected pos" write failure, an ENOSPC wrapped in another error), stops a save with CheckpointWriteError
naming the folder; the previous checkpoint stays intact."""

from __future__ import annotations

import errno
import json

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from workers.hf_fixtures import build

from rlhfkit.trainers.common import checkpointing
from rlhfkit.trainers.common.checkpointing import (
    CheckpointWriteError,
    as_write_error,
    latest_checkpoint,
    save_training_checkpoint,
    verify_checkpoint,
    write_checkpoint,
)


def _wrapped_enospc() -> RuntimeError:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("saving the optimizer failed") from inner
    except RuntimeError as outer:
        return outer


DISK_FULL = {
    "safetensors (debug form)": lambda: SafetensorError(
        'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on '
        'device" })'
    ),
    "safetensors (display form)": lambda: SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)"
    ),
    "torch unexpected pos": lambda: RuntimeError(
        "[enforce fail at inline_container.cc:626] . unexpected pos 1818176 vs 1818064"
    ),
    "torch file write failed": lambda: RuntimeError(
        "[enforce fail at inline_container.cc:815] . PytorchStreamWriter failed writing file data/3: "
        "file write failed"
    ),
    "plain ENOSPC": lambda: OSError(errno.ENOSPC, "No space left on device"),
    "ENOSPC as the cause": _wrapped_enospc,
}


def _save(root, step, value):
    def write(folder):
        save_file({"w": torch.full((8,), float(value))}, str(folder / "model.safetensors"))
        (folder / "trainer_state.json").write_text(json.dumps({"step": step}))

    return write_checkpoint(root / f"checkpoint-{step}", write, step)


@pytest.mark.parametrize("kind", list(DISK_FULL))
def test_every_form_of_a_full_disk_is_a_checkpoint_write_error(tmp_path, kind):
    _save(tmp_path, 1, 1.0)

    def write(folder):
        save_file({"w": torch.zeros(8)}, str(folder / "model.safetensors"))
        raise DISK_FULL[kind]()

    with pytest.raises(
        CheckpointWriteError, match="disk is full.*checkpoint-2.*previous checkpoint is intact"
    ):
        write_checkpoint(tmp_path / "checkpoint-2", write, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]  # staging folder removed
    assert load_file(str(tmp_path / "checkpoint-1" / "model.safetensors"))["w"][0].item() == 1.0
    assert latest_checkpoint(tmp_path) == verify_checkpoint(tmp_path / "checkpoint-1")


def test_other_write_errors_are_left_alone(tmp_path):
    for err in (RuntimeError("cannot pickle"), SafetensorError("tensor is not contiguous"), ValueError("x")):
        assert as_write_error(err, tmp_path) is err
    with pytest.raises(SafetensorError, match="not contiguous"):
        write_checkpoint(
            tmp_path / "checkpoint-1",
            lambda folder: (_ for _ in ()).throw(SafetensorError("tensor is not contiguous")),
            1,
        )
    assert list(tmp_path.iterdir()) == []


def test_safetensors_full_disk_in_a_training_checkpoint(tmp_path, monkeypatch):
    """`save_training_checkpoint` (PPO, DDPO): the weights' SafetensorError names the disk."""
    save_training_checkpoint(tmp_path / "checkpoint-1", 1, {"w": torch.ones(4)}, {})

    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(checkpointing, "save_file", full_disk)
    with pytest.raises(CheckpointWriteError, match="disk is full.*checkpoint-2"):
        save_training_checkpoint(tmp_path / "checkpoint-2", 2, {"w": torch.zeros(4)}, {})
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-1"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint")] == ["checkpoint-1"]


def test_trainer_optimizer_write_unexpected_pos(tmp_path, monkeypatch):
    """A Trainer's `optimizer.pt` written by torch.save on a full disk: CheckpointWriteError, checkpoint-2
    kept."""
    import transformers.trainer as hf_trainer

    kw = dict(per_device=2, max_steps=4, save_strategy="steps", save_steps=2)
    trainer = build("sft", str(tmp_path), **kw)
    real_save, calls = torch.save, []

    def full_disk(obj, path, *args, **kwargs):
        if str(path).endswith("optimizer.pt"):
            calls.append(path)
            if len(calls) == 2:
                real_save(obj, path, *args, **kwargs)
                raise RuntimeError(
                    "[enforce fail at inline_container.cc:626] . unexpected pos 1818176 vs 1818064"
                )
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(hf_trainer.torch, "save", full_disk)
    with pytest.raises(
        CheckpointWriteError, match="disk is full.*checkpoint-4.*previous checkpoint is intact"
    ):
        trainer.train()
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-2"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".checkpoint")]
