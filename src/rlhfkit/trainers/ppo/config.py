"""PPOConfig: every setting of the classic PPO loop (TRL 0.x field names and defaults).

A plain dataclass, not TrainingArguments: `PPOTrainer` owns its loop. Derived batch sizes are
computed once in `__post_init__` (and again by the trainer once the number of processes is known).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from dataclasses import asdict, dataclass
from typing import Any

from rlhfkit.trainers.common.config import (
    AccelerateTracking,
    GenerationOptions,
    HealthChecks,
    NonfiniteStepLimit,
    check_field_types,
    exact_div,
    option,
)

logger = logging.getLogger(__name__)

KL_PENALTIES = ("kl", "abs", "mse", "full", "k3")


def _default_exp_name() -> str:
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return script.removesuffix(".py") or "rlhfkit-ppo"


@dataclass
class PPOConfig(AccelerateTracking, NonfiniteStepLimit, GenerationOptions, HealthChecks):
    """Configuration for `PPOTrainer`.

    Sizes: each `step()` takes `batch_size` samples (per process); they are split into minibatches of
    `mini_batch_size`, and `gradient_accumulation_steps` minibatches make one optimizer step
    (`backward_batch_size`). `batch_size` must be a multiple of `backward_batch_size`.
    """

    # ---------------------------------------------------------------- the run and its records
    exp_name: str = option(help="Name of this experiment.", default_factory=_default_exp_name)
    seed: int = option(0, "Seed for python, numpy and torch at trainer construction.")
    task_name: str | None = option(None, "Name of the task (recorded in the model card).")
    model_name: str | None = option(None, "Name or path of the policy model.")
    query_dataset: str | None = option(None, "Name of the prompt dataset (for records).")
    reward_model: str | None = option(None, "Name of the reward model (for records).")
    remove_unused_columns: bool = option(
        True, "Drop dataset columns the model's forward does not take (query/response/label stay)."
    )
    push_to_hub_if_best_kwargs: dict[str, Any] = option(
        help="Accepted for compatibility and unused: rlhfkit never uploads.", default_factory=dict
    )
    steps: int = option(20000, "Number of PPO steps a training loop should run.")
    learning_rate: float = option(1e-5, "Adam learning rate (default optimizer).")
    # ---------------------------------------------------------------- KL control
    adap_kl_ctrl: bool = option(True, "Adapt the KL coefficient towards `target`.")
    init_kl_coef: float = option(0.2, "Initial KL coefficient (the fixed one when adap_kl_ctrl is off).")
    kl_penalty: str = option(
        "kl",
        "Per-token KL estimate in the reward: 'kl' (logp - ref), 'abs', 'mse' (half squared), 'full' (exact "
        "KL over the vocabulary) or 'k3'.",
    )
    target: float = option(6.0, "Target KL (summed over a response) of the adaptive controller.")
    horizon: float = option(10000.0, "Horizon of the adaptive KL controller, in samples.")
    # ---------------------------------------------------------------- advantages and losses
    gamma: float = option(1.0, "Discount factor of GAE.")
    lam: float = option(0.95, "Lambda of GAE.")
    cliprange: float = option(0.2, "Clip range of the policy ratio.")
    cliprange_value: float = option(0.2, "Clip range of the value prediction.")
    vf_coef: float = option(0.1, "Weight of the value loss in the total loss.")
    # ---------------------------------------------------------------- batch sizes and optimisation
    batch_size: int = option(256, "Samples per step() call (per process).")
    forward_batch_size: int | None = option(None, "DEPRECATED alias of mini_batch_size; sets it when given.")
    mini_batch_size: int = option(
        1, "Samples per forward/backward pass; also the chunk size of no-grad passes."
    )
    gradient_accumulation_steps: int = option(
        1, "Minibatches whose gradients are summed before one optimizer step."
    )
    world_size: int | None = option(None, "Number of processes; set by the trainer, do not set by hand.")
    ppo_epochs: int = option(4, "Optimisation passes over each batch.")
    max_grad_norm: float | None = option(None, "Clip gradients to this norm (None: off).")
    optimize_cuda_cache: bool | None = option(None, "DEPRECATED alias of optimize_device_cache.")
    optimize_device_cache: bool = option(
        False, "Free cached accelerator memory after each step (slower, leaner)."
    )
    early_stopping: bool = option(
        False, "Stop a step's PPO epochs once the policy KL exceeds 1.5 * target_kl."
    )
    target_kl: float = option(1.0, "Policy KL at which early stopping triggers (x1.5).")
    compare_steps: int = option(
        1, "Steps between best-model comparisons (kept for compatibility; unused offline)."
    )
    # ---------------------------------------------------------------- guards and score scaling
    ratio_threshold: float = option(
        10.0, "Skip a minibatch (no backward, no optimizer step) whose mean ratio exceeds this."
    )
    use_score_scaling: bool = option(False, "Divide scores by their running std.")
    use_score_norm: bool = option(
        False, "With use_score_scaling: also subtract the running mean (ignored without it)."
    )
    score_clip: float | None = option(None, "Clip (scaled) scores to [-score_clip, score_clip].")
    whiten_rewards: bool = option(False, "Whiten per-token rewards before GAE.")
    # ---------------------------------------------------------------- set by the trainer
    is_encoder_decoder: bool | None = option(None, "Set by the trainer from the model.")
    is_peft_model: bool | None = option(None, "Set by the trainer from the model.")
    backward_batch_size: int | None = option(None, "Derived: mini_batch_size * gradient_accumulation_steps.")
    global_backward_batch_size: int | None = option(None, "Derived: backward_batch_size * world_size.")
    reuse_generation_outputs: bool = option(
        True,
        "step() takes the old logprobs and values that generate() computed while sampling the same (query, "
        "response) pairs, instead of a second forward pass of the policy (equal up to float rounding). It "
        "falls back to the forward pass for responses generate() did not sample, or sampled before an "
        "optimizer step, and for bf16/fp16 policies (whose cached decoding rounds differently). Set False "
        "if you change the policy's weights yourself between generate() and step().",
    )
    global_batch_size: int | None = option(None, "Derived: batch_size * world_size.")

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.forward_batch_size is not None:
            warnings.warn(
                "forward_batch_size is deprecated; use mini_batch_size (set from it now)",
                FutureWarning,
                stacklevel=3,
            )
            self.mini_batch_size = self.forward_batch_size
        if self.optimize_cuda_cache is not None:
            warnings.warn(
                "optimize_cuda_cache is deprecated; use optimize_device_cache", FutureWarning, stacklevel=3
            )
            self.optimize_device_cache = bool(self.optimize_cuda_cache)
        for name in ("tracker_kwargs", "accelerator_kwargs", "project_kwargs", "push_to_hub_if_best_kwargs"):
            value = getattr(self, name)
            if isinstance(value, str):  # from a command line or YAML
                setattr(self, name, json.loads(value) if value.strip() else {})
            elif value is None:
                setattr(self, name, {})
        if self.use_score_norm and not self.use_score_scaling:
            # TRL ignores it too; say so once rather than fail configs written for TRL
            logger.info("PPOConfig.use_score_norm has no effect without use_score_scaling=True; ignoring it")
        self.validate()

    def validate(self) -> None:
        """Check every setting and (re)compute the derived batch sizes; raises ValueError on bad input."""
        for name in (
            "batch_size",
            "mini_batch_size",
            "gradient_accumulation_steps",
            "ppo_epochs",
            "steps",
            "max_consecutive_nonfinite_steps",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"PPOConfig.{name} must be a positive integer, got {value!r}")
        if self.kl_penalty not in KL_PENALTIES:
            raise ValueError(f"PPOConfig.kl_penalty must be one of {KL_PENALTIES}, got {self.kl_penalty!r}")
        positive = (
            "learning_rate",
            "target",
            "horizon",
            "cliprange",
            "cliprange_value",
            "target_kl",
            "ratio_threshold",
        )
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"PPOConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if self.init_kl_coef < 0:
            raise ValueError(f"PPOConfig.init_kl_coef must be >= 0, got {self.init_kl_coef}")
        if not 0 <= self.gamma <= 1 or not 0 <= self.lam <= 1:
            raise ValueError(
                f"PPOConfig.gamma and lam must lie in [0, 1], got gamma={self.gamma}, lam={self.lam}"
            )
        if self.vf_coef < 0:
            raise ValueError(f"PPOConfig.vf_coef must be >= 0, got {self.vf_coef}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"PPOConfig.max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        if self.score_clip is not None and not self.score_clip > 0:
            raise ValueError(f"PPOConfig.score_clip must be > 0 or None, got {self.score_clip}")
        if "gradient_accumulation_steps" in self.accelerator_kwargs:
            raise ValueError(
                "set gradient accumulation with PPOConfig.gradient_accumulation_steps, "
                "not in accelerator_kwargs"
            )
        self.check_vllm()
        self._derive_sizes(self.world_size or 1)

    def _derive_sizes(self, world_size: int) -> None:
        self.world_size = world_size
        backward = self.mini_batch_size * self.gradient_accumulation_steps
        exact_div(
            self.batch_size,
            backward,
            f"batch_size={self.batch_size} must be a multiple of "
            "mini_batch_size * gradient_accumulation_steps = "
            f"{self.mini_batch_size} * {self.gradient_accumulation_steps}",
        )
        self.backward_batch_size = backward
        self.global_backward_batch_size = backward * world_size
        self.global_batch_size = self.batch_size * world_size

    # The seed's names are per process; the trainer reads these, so local and global never mix.
    @property
    def local_batch_size(self) -> int:
        return self.batch_size

    @property
    def local_mini_batch_size(self) -> int:
        return self.mini_batch_size

    @property
    def local_backward_batch_size(self) -> int:
        return self.mini_batch_size * self.gradient_accumulation_steps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
