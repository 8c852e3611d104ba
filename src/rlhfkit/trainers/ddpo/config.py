"""DDPOConfig: every knob of DDPOTrainer, with the field names and defaults TRL documents."""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any

import torch

from rlhfkit.trainers.common.config import (
    AccelerateTracking,
    NonfiniteStepLimit,
    check_field_types,
    check_positive_integers,
    check_positive_numbers,
    exact_div,
    option,
)

MIXED_PRECISION_CHOICES = ("no", "fp16", "bf16")


# fields that must be >= 1, and > 0
POSITIVE_INTEGERS = (
    "num_epochs",
    "save_freq",
    "num_checkpoint_limit",
    "sample_num_steps",
    "sample_batch_size",
    "sample_num_batches_per_epoch",
    "train_batch_size",
    "train_gradient_accumulation_steps",
    "train_num_inner_epochs",
    "max_workers",
    "per_prompt_stat_tracking_buffer_size",
    "per_prompt_stat_tracking_min_count",
    "max_consecutive_nonfinite_steps",
)
POSITIVE_NUMBERS = (
    "sample_eta",
    "train_learning_rate",
    "train_clip_range",
    "train_adv_clip_max",
    "train_max_grad_norm",
)


@dataclass
class DDPOConfig(AccelerateTracking, NonfiniteStepLimit):
    """Configuration of a DDPO run (sampling, reward normalisation, PPO-style updates, logging)."""

    run_name: str = option("", "Name of the run; checkpoints go to logdir/run_name.")
    seed: int = option(42, "Random seed for sampling, prompts and initialisation.")
    logdir: str = option("logs", "Top-level folder for checkpoints and tracker logs.")
    num_epochs: int = option(100, "Number of epochs (sample, score, train) to run.")
    save_freq: int = option(1, "Save a checkpoint every this many epochs.")
    num_checkpoint_limit: int = option(5, "Keep at most this many checkpoints.")
    mixed_precision: str = option(
        "fp16", "'no', 'fp16' or 'bf16'. fp16 needs a GPU: without one it falls back to 'no' with a warning."
    )
    allow_tf32: bool = option(True, "Allow TF32 matmuls on Ampere and newer GPUs.")
    resume_from: str = option(
        "", "Checkpoint folder to resume from, or a checkpoints folder (the latest is used)."
    )
    trust_unverified_checkpoint: bool = option(
        False, "Resume from a checkpoint without manifest.json (its files go unverified), with a warning."
    )
    sample_num_steps: int = option(50, "Number of DDIM denoising steps per sample.")
    sample_eta: float = option(1.0, "DDIM eta: noise level of each step, must be > 0.")
    sample_guidance_scale: float = option(5.0, "Classifier-free guidance scale.")
    sample_batch_size: int = option(1, "Images sampled per batch (per process).")
    sample_num_batches_per_epoch: int = option(2, "Sampling batches per epoch.")
    train_batch_size: int = option(1, "Trajectories per training batch (per process).")
    train_use_8bit_adam: bool = option(False, "Use bitsandbytes' 8-bit AdamW.")
    train_learning_rate: float = option(3e-4, "AdamW learning rate.")
    train_adam_beta1: float = option(0.9, "AdamW beta1.")
    train_adam_beta2: float = option(0.999, "AdamW beta2.")
    train_adam_weight_decay: float = option(1e-4, "AdamW weight decay.")
    train_adam_epsilon: float = option(1e-8, "AdamW epsilon.")
    train_gradient_accumulation_steps: int = option(
        1, "Training batches per optimiser step (each batch covers all its timesteps)."
    )
    train_max_grad_norm: float = option(1.0, "Gradient-norm clipping threshold.")
    train_num_inner_epochs: int = option(1, "Passes over each epoch's samples.")
    train_cfg: bool = option(True, "Use classifier-free guidance when re-scoring steps.")
    train_adv_clip_max: float = option(5.0, "Advantages are clamped to +-this value.")
    train_clip_range: float = option(1e-4, "PPO clip range of the probability ratio.")
    train_timestep_fraction: float = option(
        1.0, "Fraction of each trajectory's timesteps trained on (picked at random)."
    )
    train_use_lora: bool = option(True, "Train LoRA adapters on the UNet rather than the whole UNet.")
    per_prompt_stat_tracking: bool = option(
        False, "Normalise rewards per prompt (running history) instead of per batch."
    )
    per_prompt_stat_tracking_buffer_size: int = option(
        16, "Rewards remembered per prompt for per-prompt normalisation."
    )
    per_prompt_stat_tracking_min_count: int = option(
        16, "Rewards a prompt needs before its own statistics are used."
    )
    async_reward_computation: bool = option(
        False, "Compute rewards in a thread pool while sampling continues."
    )
    max_workers: int = option(2, "Threads for asynchronous reward computation.")
    negative_prompts: str = option("", "Negative prompt used for classifier-free guidance.")

    def __post_init__(self) -> None:
        if self.mixed_precision is None:
            self.mixed_precision = "no"
        check_field_types(self)
        if self.mixed_precision not in MIXED_PRECISION_CHOICES:
            raise ValueError(
                f"mixed_precision must be one of {MIXED_PRECISION_CHOICES}, got {self.mixed_precision!r}"
            )
        if self.mixed_precision == "fp16" and not torch.cuda.is_available():
            warnings.warn(
                "mixed_precision='fp16' needs a CUDA GPU and none is available; training in full precision "
                "(mixed_precision='no') instead",
                stacklevel=3,
            )
            self.mixed_precision = "no"
        check_positive_integers(self, POSITIVE_INTEGERS)
        check_positive_numbers(self, POSITIVE_NUMBERS)
        if not 0.0 < self.train_timestep_fraction <= 1.0:
            raise ValueError(f"train_timestep_fraction must be in (0, 1], got {self.train_timestep_fraction}")
        if self.num_train_timesteps < 1:
            raise ValueError(
                f"sample_num_steps * train_timestep_fraction = {self.sample_num_steps} * "
                f"{self.train_timestep_fraction} leaves no timestep to train on"
            )
        # One optimiser step = train_batch_size * train_gradient_accumulation_steps trajectories; an
        # epoch's samples must split into whole optimiser steps.
        exact_div(
            self.samples_per_epoch,
            self.train_batch_size * self.train_gradient_accumulation_steps,
            "sample_batch_size * sample_num_batches_per_epoch must be divisible by "
            "train_batch_size * train_gradient_accumulation_steps",
        )
        if self.train_use_8bit_adam:
            try:
                import bitsandbytes  # noqa: F401
            except ImportError as err:
                raise ImportError(
                    "train_use_8bit_adam=True needs bitsandbytes: pip install bitsandbytes"
                ) from err

    @property
    def samples_per_epoch(self) -> int:
        """Trajectories each process samples per epoch."""
        return self.sample_batch_size * self.sample_num_batches_per_epoch

    @property
    def num_train_timesteps(self) -> int:
        """Timesteps of each trajectory used for training."""
        return int(self.sample_num_steps * self.train_timestep_fraction)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
