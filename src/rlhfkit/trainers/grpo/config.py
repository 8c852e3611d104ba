"""GRPOConfig: TrainingArguments plus group-relative policy optimisation, with TRL's names and defaults.

Sizes count completions. One update (one optimizer step, one `global_step`) trains on
`per_device_train_batch_size * gradient_accumulation_steps` completions per process. One generation batch
holds `per_device_train_batch_size * steps_per_generation` completions per process (`generation_batch_size`
across processes): `num_generations` of each of its prompts, the group of a prompt on consecutive rows. It is
trained on for `steps_per_generation / gradient_accumulation_steps` updates, `num_iterations` times over.

Departures from TRL's defaults, for a CPU-first library: `gradient_checkpointing` and `bf16` stay off;
`steps_per_generation` must be a multiple of `gradient_accumulation_steps` and each process's generation
batch must hold whole groups (TRL lets a group span two micro-batches or two processes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlhfkit.core.policy_losses import POLICY_LOSSES
from rlhfkit.trainers.common.config import (
    GenerationOptions,
    HealthChecks,
    HFTrainerConfig,
    ModelInitKwargs,
    check_positive_integers,
    exact_div,
    option,
)

SCALE_REWARDS = ("group", "batch", "none")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


@dataclass
class GRPOConfig(GenerationOptions, HealthChecks, ModelInitKwargs, HFTrainerConfig):
    """Configuration for `GRPOTrainer`; every `transformers.TrainingArguments` field also applies."""

    learning_rate: float = option(1e-6, "Initial AdamW learning rate (TRL's GRPO default).")
    logging_steps: float = option(10, "Log the metrics every this many updates.")
    remove_unused_columns: bool | None = option(
        False, "Kept False: every dataset column reaches the reward functions."
    )
    # ---------------------------------------------------------------- data and generation
    num_generations: int = option(8, "Completions sampled per prompt (the group; >= 2).")
    max_prompt_length: int | None = option(
        512, "Prompts longer than this many tokens keep their last ones (None: no limit)."
    )
    max_completion_length: int = option(512, "Maximum number of generated tokens.")
    generation_batch_size: int | None = option(
        None,
        "Completions per generation, all processes. Default: per_device_train_batch_size * processes "
        "* steps_per_generation. Give this or steps_per_generation, not both.",
    )
    steps_per_generation: int | None = option(
        None, "Micro-batches per generation (default: gradient_accumulation_steps)."
    )
    temperature: float = option(1.0, "Sampling temperature (also applied to logprobs).")
    top_p: float = option(1.0, "Nucleus sampling: keep the top tokens up to this mass.")
    top_k: int = option(0, "Sample among the k most likely tokens (0: all).")
    min_p: float | None = option(None, "Drop tokens below min_p times the top token's probability.")
    repetition_penalty: float = option(1.0, "Penalise tokens seen in prompt or completion; >1 repeats less.")
    generation_kwargs: dict | None = option(
        None, "Further transformers GenerationConfig settings; they win over the above."
    )
    # ---------------------------------------------------------------- the loss
    beta: float = option(0.0, "KL coefficient. 0 (default): no reference model is built or loaded.")
    num_iterations: int = option(1, "Passes over each generation batch (mu in the GRPO paper).")
    epsilon: float = option(0.2, "Lower clipping range of the ratio (and upper by default).")
    epsilon_high: float | None = option(None, "Upper clipping range (DAPO's clip-higher); default: epsilon.")
    delta: float | None = option(
        None, "Two-sided clipping: cap the ratio at delta for negative advantages (> 1)."
    )
    importance_sampling_level: str = option(
        "token", "'token': one ratio per token; 'sequence': one per completion (GSPO)."
    )
    loss_type: str = option(
        "dapo", f"The policy loss, a key of core.policy_losses.POLICY_LOSSES: {', '.join(POLICY_LOSSES)}."
    )
    scale_rewards: str = option(
        "group", "Divide advantages by the reward std of the 'group', the 'batch', or 'none' (True/False)."
    )
    mask_truncated_completions: bool = option(
        False, "Leave completions that hit max_completion_length out of the loss (DAPO)."
    )
    reward_weights: list[float] | None = option(None, "One weight per reward function (default: all 1).")
    top_entropy_quantile: float = option(
        1.0, "Train only on the top quantile of tokens by entropy (1.0: all; the paper uses 0.2)."
    )
    use_bias_correction_kl: bool = option(
        True, "Weight the per-token KL by the importance ratio (unbiased reverse-KL gradient)."
    )
    sync_ref_model: bool = option(
        False, "Mix the reference toward the policy every ref_model_sync_steps (TR-DPO)."
    )
    ref_model_mixup_alpha: float = option(0.6, "ref = alpha * policy + (1 - alpha) * ref at each sync.")
    ref_model_sync_steps: int = option(512, "Updates between two reference syncs.")
    # ---------------------------------------------------------------- DAPO dynamic sampling (not in TRL)
    dynamic_sampling: bool = option(
        False,
        "DAPO: drop groups whose rewards are all equal (no learning signal) and sample more prompts "
        "until the generation batch is full, at most max_sampling_rounds rounds.",
    )
    max_sampling_rounds: int = option(
        3, "Dynamic sampling: generation rounds per batch at most; then dropped groups fill the rest."
    )
    # ---------------------------------------------------------------- logging
    log_completions: bool = option(
        False, "Print a table of sampled completions and rewards every logging step."
    )
    num_completions_to_print: int | None = option(None, "Rows of that table (None: all).")

    def __post_init__(self):
        # TRL accepted booleans for scale_rewards; the command line passes strings
        alias = {True: "group", False: "none", "true": "group", "false": "none"}
        key = self.scale_rewards.lower() if isinstance(self.scale_rewards, str) else self.scale_rewards
        self.scale_rewards = alias.get(key, self.scale_rewards)
        super().__post_init__()
        self.compute_batch_sizes()

    def validate(self) -> None:
        check_positive_integers(
            self,
            (
                "num_generations",
                "max_completion_length",
                "num_iterations",
                "ref_model_sync_steps",
                "max_sampling_rounds",
            ),
            optional=(
                "max_prompt_length",
                "steps_per_generation",
                "generation_batch_size",
                "num_completions_to_print",
            ),
        )
        if self.num_generations < 2:
            raise ValueError(
                f"num_generations must be >= 2 (advantages compare the completions of one prompt), "
                f"got {self.num_generations}"
            )
        self._check_choices()
        self._check_ranges()
        if self.steps_per_generation is not None and self.generation_batch_size is not None:
            raise ValueError("give generation_batch_size or steps_per_generation, not both")
        if self.reward_weights is not None and (
            len(self.reward_weights) == 0 or not all(math.isfinite(w) for w in self.reward_weights)
        ):
            raise ValueError(
                f"reward_weights must be a non-empty list of finite numbers, got {self.reward_weights}"
            )
        if self.sync_ref_model and self.beta == 0:
            raise ValueError("sync_ref_model needs beta > 0: with beta=0 there is no reference model to sync")

    def _check_choices(self) -> None:
        choices = {
            "loss_type": (self.loss_type, tuple(POLICY_LOSSES)),  # read now: the registry is the one list
            "scale_rewards": (self.scale_rewards, SCALE_REWARDS),
            "importance_sampling_level": (self.importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS),
        }
        for name, (value, allowed) in choices.items():
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")

    def _check_ranges(self) -> None:
        checks = {
            "temperature": (self.temperature, lambda v: v > 0, "> 0"),
            "top_p": (self.top_p, lambda v: 0 < v <= 1, "in (0, 1]"),
            "top_k": (self.top_k, lambda v: v >= 0, ">= 0 (0: off)"),
            "min_p": (self.min_p, lambda v: v is None or 0 <= v <= 1, "in [0, 1] or None"),
            "repetition_penalty": (self.repetition_penalty, lambda v: v > 0, "> 0"),
            "beta": (self.beta, lambda v: v >= 0, ">= 0"),
            "epsilon": (self.epsilon, lambda v: v > 0, "> 0"),
            "epsilon_high": (self.epsilon_high, lambda v: v is None or v > 0, "> 0 or None"),
            "delta": (self.delta, lambda v: v is None or v > 1, "> 1 or None"),
            "top_entropy_quantile": (self.top_entropy_quantile, lambda v: 0 <= v <= 1, "in [0, 1]"),
            "ref_model_mixup_alpha": (self.ref_model_mixup_alpha, lambda v: 0 <= v <= 1, "in [0, 1]"),
        }
        for name, (value, ok, expected) in checks.items():
            if not ok(value):
                raise ValueError(f"{name} must be {expected}, got {value!r}")

    def compute_batch_sizes(self) -> None:
        """Fill in steps_per_generation / generation_batch_size and check that every division is exact."""
        processes = self.world_size
        per_step = self.per_device_train_batch_size * processes
        if self.steps_per_generation is None and self.generation_batch_size is None:
            self.steps_per_generation = self.gradient_accumulation_steps
        elif self.steps_per_generation is None:
            self.steps_per_generation = exact_div(
                self.generation_batch_size,
                per_step,
                "generation_batch_size by per_device_train_batch_size * number of processes",
            )
        self.generation_batch_size = per_step * self.steps_per_generation
        exact_div(
            self.steps_per_generation,
            self.gradient_accumulation_steps,
            "steps_per_generation must be a multiple of gradient_accumulation_steps",
        )
        exact_div(
            self.local_generation_batch_size,
            self.num_generations,
            "per_device_train_batch_size * steps_per_generation (one process's completions per generation) "
            "must be a multiple of num_generations",
        )

    @property
    def local_generation_batch_size(self) -> int:
        """Completions one process samples per generation."""
        return self.per_device_train_batch_size * self.steps_per_generation

    @property
    def local_prompts_per_generation(self) -> int:
        return self.local_generation_batch_size // self.num_generations

    @property
    def updates_per_generation(self) -> int:
        """Optimizer steps one generation batch is split into (each pass over it)."""
        return self.steps_per_generation // self.gradient_accumulation_steps
