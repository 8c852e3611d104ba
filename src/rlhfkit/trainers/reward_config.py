"""RewardConfig: TrainingArguments plus the reward-model options (seed 001's RewardTrainer keywords)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhfkit.trainers.hf_trainer_config import HFTrainerConfig

OVERLONG_POLICIES = ("drop", "truncate")


@dataclass
class RewardConfig(HFTrainerConfig):
    """Configuration for `RewardTrainer`; every `transformers.TrainingArguments` field also applies."""

    max_length: int | None = field(
        default=512,
        metadata={"help": "Longest tokenised chosen/rejected sequence (prompt included). None: no limit."},
    )
    overlong_policy: str = field(
        default="drop",
        metadata={
            "help": "What to do with a pair where either side is longer than max_length: 'drop' the pair, "
            "or 'truncate' both sides to max_length tokens (keeping the start). The count is logged."
        },
    )
    center_rewards_coefficient: float | None = field(
        default=None,
        metadata={
            "help": "Weight of the reward-centering term coef * mean((r_chosen + r_rejected)^2), which keeps "
            "scores near zero mean (Eisenstein et al. 2023). None or 0 disables it."
        },
    )
    dataset_num_proc: int | None = field(
        default=None, metadata={"help": "Worker processes for tokenising raw text datasets."}
    )
    disable_dropout: bool = field(
        default=False, metadata={"help": "Set every dropout probability in the model to 0."}
    )
    remove_unused_columns: bool = field(
        default=False,
        metadata={
            "help": "Kept False: the pair columns (input_ids_chosen, ...) are not forward() arguments."
        },
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
