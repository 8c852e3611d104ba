"""Checkpoint and resume for `PPOTrainer`: a resumed run continues with the same numbers.

A checkpoint folder holds `policy.safetensors` (every weight of the policy, value head included, PEFT or
not) and `trainer_state.pt` (optimizer, scheduler, KL controller, running score moments, RNG state, step
counter), readable with `torch.load(weights_only=True)`. It is written through `atomic_directory`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlhfkit.trainers.common import atomic_directory, rng_state, set_rng_state, validate_checkpoint

TRAINER_STATE_FILE = "trainer_state.pt"
POLICY_WEIGHTS_FILE = "policy.safetensors"


def rng_state_tensors(state: dict[str, Any]) -> dict[str, Any]:
    """`common.rng_state()` in a form `torch.load(weights_only=True)` accepts (numpy array -> tensor)."""
    kind, keys, pos, has_gauss, cached = state["numpy"]
    out = dict(state)
    out["numpy"] = (kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss), float(cached))
    out["python"] = (state["python"][0], list(state["python"][1]), state["python"][2])
    return out


def rng_state_from_tensors(state: dict[str, Any]) -> dict[str, Any]:
    """Inverse of `rng_state_tensors`."""
    kind, keys, pos, has_gauss, cached = state["numpy"]
    out = dict(state)
    out["numpy"] = (kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached)
    version, internal, gauss = state["python"]
    out["python"] = (version, tuple(internal), gauss)
    return out


def save(trainer: Any, checkpoint_dir: str) -> None:
    """Write `trainer`'s full state to `checkpoint_dir` (main process only; RNG of the main process)."""
    from safetensors.torch import save_model

    trainer.accelerator.wait_for_everyone()
    if not trainer.accelerator.is_main_process:
        return
    state = {
        "step": trainer.current_step,
        "kl_ctl": trainer.kl_ctl.state_dict(),
        "running": trainer.running.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "lr_scheduler": trainer.lr_scheduler.state_dict() if trainer.lr_scheduler is not None else None,
        "rng": rng_state_tensors(rng_state()),
    }
    with atomic_directory(checkpoint_dir) as tmp:
        save_model(trainer.policy, str(tmp / POLICY_WEIGHTS_FILE))
        torch.save(state, tmp / TRAINER_STATE_FILE)


def load(trainer: Any, checkpoint_dir: str) -> None:
    """Restore a folder written by `save` into `trainer` (same architecture, same config)."""
    from safetensors.torch import load_model

    folder = Path(checkpoint_dir)
    if not (folder / TRAINER_STATE_FILE).is_file() or not (folder / POLICY_WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{folder} is not a PPOTrainer checkpoint (no {TRAINER_STATE_FILE})")
    validate_checkpoint(folder)  # a truncated or corrupt file: a clear error before anything is loaded
    load_model(trainer.policy, str(folder / POLICY_WEIGHTS_FILE), device=str(trainer.current_device))
    state = torch.load(folder / TRAINER_STATE_FILE, map_location="cpu", weights_only=True)
    trainer.optimizer.load_state_dict(state["optimizer"])
    if trainer.lr_scheduler is not None and state["lr_scheduler"] is not None:
        trainer.lr_scheduler.load_state_dict(state["lr_scheduler"])
    trainer.kl_ctl.load_state_dict(state["kl_ctl"])
    trainer.running.load_state_dict(state["running"])
    set_rng_state(rng_state_from_tensors(state["rng"]))
    trainer.current_step = int(state["step"])
