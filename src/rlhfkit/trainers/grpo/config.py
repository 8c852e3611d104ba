"""GRPOConfig: TrainingArguments plus group-relative policy optimisation, with TRL's names and defaults.

Sizes and the shared sampling fields: `trainers.common.group_config.GroupRollouts`.

Departures from TRL's defaults, for a CPU-first library: `gradient_checkpointing` and `bf16` stay off;
`steps_per_generation` must be a multiple of `gradient_accumulation_steps` and each process's generation
batch must hold whole groups (TRL lets a group span two micro-batches or two processes).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from rlhfkit.core.policy_losses import POLICY_LOSSES
from rlhfkit.core.sampler_correction import SAMPLER_CORRECTION_MODES
from rlhfkit.trainers.common.config import (
    GenerationOptions,
    HealthChecks,
    HFTrainerConfig,
    ModelInitKwargs,
    RouterAuxLossCoef,
    check_positive_integers,
    option,
)
from rlhfkit.trainers.common.group_config import GroupRollouts

SCALE_REWARDS = ("group", "batch", "none")
TOKEN_SUMMED_LOSSES = ("bnpo", "dr_grpo", "dapo", "cispo")  # normalised over tokens, not per sequence
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


@dataclass
class SamplerCorrection:
    """TRL's importance-sampling correction of the sampler/trainer mismatch (`core.sampler_correction`).

    TRL applies it (default on) only to vLLM's samples. rlhfkit's own samplers stream logprobs that match
    the training pass to float noise, so the default None keeps TRL's behaviour: on exactly when a separate
    inference engine samples (`use_vllm`), off otherwise; True turns it on for any sampler (e.g. sampling
    in bf16), False off.
    """

    vllm_importance_sampling_correction: bool | None = option(
        None,
        "Re-weight the policy loss by pi_old / pi_sampler (the training policy's and the sampler's logprobs "
        "of the sampled tokens) as vllm_importance_sampling_mode says. None: on only for a separate "
        "inference engine (use_vllm, as TRL's default True); True: for every sampler; False: off.",
    )
    vllm_importance_sampling_mode: str = option(
        "sequence_mask",
        "'token_truncate', 'token_mask', 'sequence_truncate' or 'sequence_mask': per-token ratios or one "
        "ratio per completion (exp of the summed log-ratios); truncate clamps it to [clip_min, clip_max], "
        "mask zeroes it outside.",
    )
    vllm_importance_sampling_clip_max: float | None = option(
        3.0, "Upper bound C_max of the importance ratio (None: none)."
    )
    vllm_importance_sampling_clip_min: float | None = option(
        None, "Lower bound C_min of the importance ratio (None: none)."
    )
    vllm_importance_sampling_cap: float | None = option(
        None, "Deprecated (as in TRL): sets vllm_importance_sampling_clip_max."
    )

    def __post_init__(self):
        if self.vllm_importance_sampling_cap is not None:
            warnings.warn(
                "vllm_importance_sampling_cap is deprecated; use vllm_importance_sampling_clip_max",
                FutureWarning,
                stacklevel=4,
            )
            self.vllm_importance_sampling_clip_max = self.vllm_importance_sampling_cap
        super().__post_init__()

    def sampler_correction_active(self) -> bool:
        """Whether the trainer re-weights the loss for the sampler/trainer mismatch (see the class)."""
        if self.vllm_importance_sampling_correction is None:
            return bool(getattr(self, "use_vllm", False))
        return self.vllm_importance_sampling_correction

    def check_sampler_correction(self) -> None:
        """ValueError naming the field: an unknown mode, a negative or inverted bound, a truncation with no
        bound, or vespo with a sequence mode (TRL's checks)."""
        prefix, mode = "vllm_importance_sampling_", self.vllm_importance_sampling_mode
        low, high = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        if mode not in SAMPLER_CORRECTION_MODES:
            raise ValueError(
                f"{prefix}mode must be one of {', '.join(SAMPLER_CORRECTION_MODES)}; got {mode!r}"
            )
        for name, value in (("clip_min", low), ("clip_max", high)):
            if value is not None and not value >= 0:
                raise ValueError(f"{prefix}{name} must be a number >= 0 or None, got {value!r}")
        if low is not None and high is not None and not low < high:
            raise ValueError(f"{prefix}clip_min ({low}) must be less than {prefix}clip_max ({high})")
        if self.vllm_importance_sampling_correction is not False and mode.endswith("truncate"):
            if low is None and high is None:
                raise ValueError(
                    f"{prefix}mode={mode!r} needs {prefix}clip_min or {prefix}clip_max (both None)"
                )
        if self.sampler_correction_active() and self.loss_type == "vespo" and mode.startswith("sequence"):
            raise ValueError(
                f"loss_type='vespo' folds per-token importance weights into its own sequence ratio: "
                f"{prefix}mode must be 'token_truncate' or 'token_mask' with the correction on, got {mode!r}"
            )


@dataclass
class GRPOConfig(
    SamplerCorrection,
    RouterAuxLossCoef,
    GroupRollouts,
    GenerationOptions,
    HealthChecks,
    ModelInitKwargs,
    HFTrainerConfig,
):
    """Configuration for `GRPOTrainer`; every `transformers.TrainingArguments` field also applies."""

    learning_rate: float = option(1e-6, "Initial AdamW learning rate (TRL's GRPO default).")
    logging_steps: float = option(10, "Log the metrics every this many updates.")
    remove_unused_columns: bool | None = option(
        False, "Kept False: every dataset column reaches the reward functions."
    )
    num_generations: int = option(8, "Completions sampled per prompt (the group; >= 2).")
    temperature: float = option(1.0, "Sampling temperature (also applied to logprobs).")
    # ---------------------------------------------------------------- the loss
    beta: float = option(0.0, "KL coefficient. 0 (default): no reference model is built or loaded.")
    delta: float | None = option(
        None, "Two-sided clipping: cap the ratio at delta for negative advantages (> 1)."
    )
    importance_sampling_level: str = option(
        "token", "'token': one ratio per token; 'sequence': one per completion (GSPO)."
    )
    loss_type: str = option(
        "dapo", f"The policy loss, a key of core.policy_losses.POLICY_LOSSES: {', '.join(POLICY_LOSSES)}."
    )
    sapo_temperature_pos: float = option(1.0, "loss_type='sapo': temperature of the gate for A > 0.")
    sapo_temperature_neg: float = option(1.05, "loss_type='sapo': temperature of the gate for A <= 0.")
    vespo_k_pos: float = option(2.0, "loss_type='vespo': power k of the gamma weight for A >= 0.")
    vespo_lambda_pos: float = option(3.0, "loss_type='vespo': decay lambda of the gamma weight for A >= 0.")
    vespo_k_neg: float = option(3.0, "loss_type='vespo': power k of the gamma weight for A < 0.")
    vespo_lambda_neg: float = option(2.0, "loss_type='vespo': decay lambda of the gamma weight for A < 0.")
    scale_rewards: str = option(
        "group", "Divide advantages by the reward std of the 'group', the 'batch', or 'none' (True/False)."
    )
    multi_objective_aggregation: str = option(
        "sum_then_normalize",
        "How several reward functions combine: 'sum_then_normalize' (weighted sum, then advantages as "
        "scale_rewards says) or 'normalize_then_sum' (GDPO: each reward normalised in its group, weighted "
        "sum, standardised over the batch; scale_rewards unused).",
    )
    top_entropy_quantile: float = option(
        1.0, "Train only on the top quantile of tokens by entropy (1.0: all; the paper uses 0.2)."
    )
    use_bias_correction_kl: bool = option(
        True, "Weight the per-token KL by the importance ratio (unbiased reverse-KL gradient)."
    )
    off_policy_mask_threshold: float | None = option(
        None,
        "DeepSeek-V3.2's off-policy sequence mask: leave out of the policy loss the completions with a "
        "negative advantage whose mean log pi_sampling - log pi exceeds this (e.g. 0.5; None: off).",
    )
    # ---------------------------------------------------------------- entropy bonus
    entropy_coef: float = option(
        0.0,
        "Entropy bonus: the loss loses entropy_coef * the mean per-token entropy of the trained tokens (the "
        "same for every loss_type). With use_adaptive_entropy, the starting coefficient.",
    )
    use_adaptive_entropy: bool = option(
        False,
        "Skywork-OR1: each update, raise entropy_coef by entropy_coef_delta while the entropy is at or below "
        "entropy_target, lower it above; the bonus applies only at or below the target.",
    )
    entropy_coef_min: float = option(0.0, "Adaptive entropy: lowest coefficient.")
    entropy_coef_max: float = option(1.0, "Adaptive entropy: highest coefficient.")
    entropy_coef_delta: float = option(0.005, "Adaptive entropy: change of the coefficient per update.")
    entropy_target: float = option(
        0.2, "Adaptive entropy: target mean per-token entropy (nats) of the trained tokens."
    )
    cast_lm_head_to_fp32: bool = option(
        False,
        "Hold the output projection (lm_head) of the policy and reference in float32 and compute the logits "
        "in float32 (ScaleRL). Full logits then: the memory-lean chunked head is not used.",
    )
    # ---------------------------------------------------------------- DAPO dynamic sampling (not in TRL)
    dynamic_sampling: bool = option(
        False,
        "DAPO: drop groups whose rewards are all equal (no learning signal) and sample more prompts "
        "until the generation batch is full, at most max_sampling_rounds rounds.",
    )
    max_sampling_rounds: int = option(
        3, "Dynamic sampling: generation rounds per batch at most; then dropped groups fill the rest."
    )

    def __post_init__(self):
        # TRL accepted booleans for scale_rewards; the command line passes strings
        alias = {True: "group", False: "none", "true": "group", "false": "none"}
        key = self.scale_rewards.lower() if isinstance(self.scale_rewards, str) else self.scale_rewards
        self.scale_rewards = alias.get(key, self.scale_rewards)
        super().__post_init__()
        self.compute_group_sizes()

    def validate(self) -> None:
        self.check_groups()
        check_positive_integers(self, ("max_sampling_rounds",))
        choices = {
            "loss_type": (self.loss_type, tuple(POLICY_LOSSES)),  # read now: the registry is the one list
            "scale_rewards": (self.scale_rewards, SCALE_REWARDS),
            "importance_sampling_level": (self.importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS),
            "multi_objective_aggregation": (self.multi_objective_aggregation, MULTI_OBJECTIVE_AGGREGATIONS),
        }
        for name, (value, allowed) in choices.items():
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
        checks = {
            "delta": (self.delta, lambda v: v is None or v > 1, "> 1 or None"),
            "off_policy_mask_threshold": (
                self.off_policy_mask_threshold,
                lambda v: v is None or v >= 0,
                ">= 0 or None",
            ),
            "sapo_temperature_pos": (self.sapo_temperature_pos, lambda v: v > 0, "> 0"),
            "sapo_temperature_neg": (self.sapo_temperature_neg, lambda v: v > 0, "> 0"),
            "entropy_coef_delta": (self.entropy_coef_delta, lambda v: v >= 0, ">= 0"),
            "entropy_coef_max": (
                self.entropy_coef_max,
                lambda v: v >= self.entropy_coef_min,
                ">= entropy_coef_min",
            ),
            "top_entropy_quantile": (self.top_entropy_quantile, lambda v: 0 <= v <= 1, "in [0, 1]"),
        }
        for name, (value, ok, expected) in checks.items():
            if not ok(value):
                raise ValueError(f"{name} must be {expected}, got {value!r}")
        self.check_sampler_correction()
        self.check_vllm()
        self._warn_level_mismatch()

    def _warn_level_mismatch(self) -> None:
        """Settings TRL also warns about: a loss meant for the other importance-sampling level."""
        if self.loss_type == "luspo" and self.importance_sampling_level != "sequence":
            warnings.warn(
                "loss_type='luspo' is meant with importance_sampling_level='sequence' (the paper's setup); "
                "at token level each token's clipped term is summed instead",
                UserWarning,
                stacklevel=4,
            )
        if self.loss_type == "vespo" and self.importance_sampling_level != "token":
            warnings.warn(
                "loss_type='vespo' forms its own sequence-level weight from the token log-ratios; "
                "importance_sampling_level has no effect on it (leave it 'token')",
                UserWarning,
                stacklevel=4,
            )
        if self.importance_sampling_level == "sequence" and self.loss_type in TOKEN_SUMMED_LOSSES:
            warnings.warn(
                f"importance_sampling_level='sequence' with loss_type={self.loss_type!r}: this loss sums the "
                "per-token terms, so long completions weigh more and the objective is not GSPO's "
                "per-sequence one; for GSPO as published use loss_type='grpo'",
                UserWarning,
                stacklevel=4,
            )
