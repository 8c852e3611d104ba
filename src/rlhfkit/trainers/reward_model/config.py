"""RewardConfig: TrainingArguments plus the reward-model options (TRL 0.x's RewardTrainer keywords)."""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.trainers.common.config import (
    ChatTemplatePath,
    HFTrainerConfig,
    MaxLength,
    ModelInitKwargs,
    PadToMultipleOf,
    TokenizesDatasets,
    option,
)

OVERLONG_POLICIES = ("drop", "truncate")


@dataclass
class RewardConfig(
    ChatTemplatePath, PadToMultipleOf, ModelInitKwargs, TokenizesDatasets, MaxLength, HFTrainerConfig
):
    """Configuration for `RewardTrainer`; every `transformers.TrainingArguments` field also applies."""

    overlong_policy: str = option(
        "drop",
        "What to do with a pair where either side is longer than max_length: 'drop' the pair, or 'truncate' "
        "both sides to max_length tokens (keeping the start). The count is logged.",
    )
    center_rewards_coefficient: float | None = option(
        None,
        "Weight of the reward-centering term coef * mean((r_chosen + r_rejected)^2), which keeps scores "
        "near zero mean (Eisenstein et al. 2023). None or 0 disables it.",
    )
    disable_dropout: bool = option(False, "Set every dropout probability in the model to 0.")
    pad_token: str | None = option(
        None, "Padding token (in the tokenizer's vocabulary). None: the tokenizer's pad token, else its eos."
    )
    eos_token: str | None = option(
        None,
        "End-of-sequence token (in the tokenizer's vocabulary), set on the tokenizer and the model config.",
    )

    def validate(self) -> None:
        if self.max_length is not None and self.max_length < 2:
            raise ValueError(f"max_length must be >= 2 tokens or None, got {self.max_length}")
        if self.overlong_policy not in OVERLONG_POLICIES:
            raise ValueError(
                f"overlong_policy must be one of {OVERLONG_POLICIES}, got {self.overlong_policy!r}"
            )
        if self.center_rewards_coefficient is not None and self.center_rewards_coefficient < 0:
            raise ValueError(
                f"center_rewards_coefficient must be >= 0 or None, got {self.center_rewards_coefficient}"
            )
