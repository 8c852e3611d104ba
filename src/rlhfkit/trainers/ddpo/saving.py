"""Saving a DDPO run: the trained model in diffusers format, and resumable checkpoints.

`save_pretrained` writes LoRA weights or a full pipeline. `save_checkpoint` writes `checkpoint-<epochs>`
in the format of `rlhfkit.trainers.common.checkpointing`; `DDPOConfig.resume_from` reads it back.

Under FSDP each rank holds shards of the UNet: every rank takes part in gathering whole tensors (weights,
and the optimizer's state keyed by parameter name), and the main process writes them, in the files of an
unsharded run.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rlhfkit.trainers.common.checkpointing import (
    WEIGHTS_FILE,
    load_training_checkpoint,
    prune_checkpoints,
    save_training_checkpoint,
)
from rlhfkit.trainers.common.sharding import (
    gather_optimizer_state,
    gather_tensors,
    load_optimizer_state,
    shard_like,
)

logger = logging.getLogger(__name__)


class SavingMethods:
    """Mixed into `DDPOTrainer`; relies on its `config`, `accelerator`, `sd_pipeline`, `unet`, `optimizer`,
    `stat_tracker`, `checkpoint_dir`, `_fsdp` and its epoch and step counters."""

    def save_pretrained(self, save_directory: str | Path) -> None:
        """Save the trained model in diffusers format (LoRA weights or a full pipeline)."""
        if self._fsdp:  # the pipeline writes its own (here sharded) tensors; a checkpoint gathers them
            raise NotImplementedError(
                "DDPOTrainer.save_pretrained does not support a UNet sharded by FSDP yet: write a "
                "checkpoint (save_checkpoint, on every rank), resume it in one process "
                "(DDPOConfig.resume_from) and call save_pretrained there"
            )
        self.sd_pipeline.save_pretrained(save_directory)

    def save_checkpoint(self, epoch: int) -> Path:
        """Write `checkpoint-<epochs done>` (trained weights, optimiser, RNG, counters), keep the newest
        `num_checkpoint_limit`. Format, checksums and lock: `rlhfkit.trainers.common.checkpointing`. Call it
        on every rank: the main process writes, after (under FSDP) every rank has helped gather the shards,
        and each rank adds its own RNG state."""
        final = self.checkpoint_dir / f"checkpoint-{epoch + 1}"
        weights = self.sd_pipeline.trainable_state_dict()
        extra = {"epoch": epoch, "global_step": self.global_step}
        if (
            self._fsdp
        ):  # whole tensors from the shards; the optimizer's too (`_checkpoint_parts` leaves it out)
            weights = gather_tensors(weights)
            extra["optimizer"] = gather_optimizer_state(self.unet, self.optimizer)
        save_training_checkpoint(final, epoch + 1, weights, self._checkpoint_parts(), extra=extra)
        if self.accelerator.is_main_process:
            prune_checkpoints(self.checkpoint_dir, self.config.num_checkpoint_limit, protect=(str(final),))
        return final

    def _load_checkpoint(self, path: Path) -> None:
        from safetensors.torch import load_file

        parts, trust = self._checkpoint_parts(), self.config.trust_unverified_checkpoint
        path, state = load_training_checkpoint(path, parts, trust_unverified_checkpoint=trust)
        weights = load_file(str(path / WEIGHTS_FILE))
        if self._fsdp:  # every rank read the whole tensors; each keeps its own shard of them
            weights = shard_like(self.sd_pipeline.trainable_state_dict(), weights)
            load_optimizer_state(self.unet, self.optimizer, state["optimizer"])
        self.sd_pipeline.load_trainable_state_dict(weights)
        self.first_epoch, self.global_step = state["epoch"] + 1, state["global_step"]
        logger.info("resumed from %s at epoch %d, global step %d", path, self.first_epoch, self.global_step)

    def _checkpoint_parts(self) -> dict[str, Any]:
        return {"optimizer": None if self._fsdp else self.optimizer, "stat_tracker": self.stat_tracker}
