"""KTOConfig: TrainingArguments plus Kahneman-Tversky optimisation options (TRL 1.x's KTOTrainer)."""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.trainers.common.config import (
    DatasetNumProc,
    HFTrainerConfig,
    ModelInitKwargs,
    RouterAuxLossCoef,
    SyncRefModel,
    check_positive_integers,
    option,
)


@dataclass
class KTOConfig(RouterAuxLossCoef, SyncRefModel, ModelInitKwargs, DatasetNumProc, HFTrainerConfig):
    """Configuration for `KTOTrainer`; every `transformers.TrainingArguments` field also applies.

    Defaults that differ from TrainingArguments, as in TRL 1.x: learning_rate 1e-6, logging_steps 10 and
    train_sampling_strategy "sequential" (the KL completions pair each row with its neighbours in a batch).
    """

    learning_rate: float = option(1e-6, "Initial learning rate of AdamW.")
    logging_steps: float = option(
        10, "Log every this many update steps (a float below 1: that fraction of the total steps)."
    )
    train_sampling_strategy: str = option(
        "sequential",
        "Order of the training rows: 'sequential' (needed by loss_type='kto': each row's KL completion is "
        "its neighbour's within a batch), 'random' or 'group_by_length' (apo_zero_unpaired only).",
    )
    remove_unused_columns: bool = option(
        False, "Kept False: the trainer picks the columns it needs; they are not all forward() arguments."
    )
    max_length: int | None = option(
        1024, "Longest prompt + completion in tokens; longer ones are cut from the right. None: no limit."
    )
    pad_to_multiple_of: int | None = option(
        None, "Pad each batch's width to a multiple of this (None: to its longest row)."
    )
    disable_dropout: bool = option(True, "Set dropout to 0 in the policy and reference models.")
    precompute_ref_log_probs: bool = option(
        False, "Compute the reference log-probs of every row once, so a step runs only the policy."
    )
    precompute_ref_batch_size: int | None = option(
        None, "Batch size of that precomputation (None: per_device_train/eval_batch_size)."
    )
    loss_type: str = option(
        "kto",
        "'kto' (Ethayarajh et al. 2024: against a KL reference point) or 'apo_zero_unpaired' (APO-zero on "
        "unpaired rows: against the reference itself).",
    )
    beta: float = option(
        0.1, "Strength of the implicit KL to the reference: larger beta keeps the policy closer."
    )
    desirable_weight: float = option(
        1.0, "Weight of the desirable rows' losses (raise it when they are fewer than undesirable ones)."
    )
    undesirable_weight: float = option(1.0, "Weight of the undesirable rows' losses.")
    activation_offloading: bool = option(False, "Offload activations to the CPU; not offered (False only).")

    def validate(self) -> None:
        from rlhfkit.core.kto import KTO_LOSSES

        if self.loss_type not in KTO_LOSSES:
            raise ValueError(f"loss_type must be one of {sorted(KTO_LOSSES)}, got {self.loss_type!r}")
        if not self.beta > 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        for name in ("desirable_weight", "undesirable_weight"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        check_positive_integers(self, (), ("max_length", "pad_to_multiple_of", "precompute_ref_batch_size"))
        self.check_sync_ref_model()
        if self.activation_offloading:
            raise ValueError("activation_offloading must be False: rlhfkit does not offload activations")
        if self.sync_ref_model and self.precompute_ref_log_probs:
            raise ValueError(
                "sync_ref_model and precompute_ref_log_probs exclude each other: precomputed reference "
                "log-probs would go stale when the reference moves; turn one off"
            )
        if self.loss_type == "kto" and self.train_sampling_strategy != "sequential":
            raise ValueError(
                "train_sampling_strategy must be 'sequential' with loss_type='kto' (each row's KL completion "
                f"is its neighbour's in a fixed-order batch), got {self.train_sampling_strategy!r}"
            )
        if self.loss_type == "kto" and self.per_device_train_batch_size < 2:
            raise ValueError(
                "per_device_train_batch_size must be at least 2 with loss_type='kto': the KL reference point "
                f"pairs each prompt with another row's completion, got {self.per_device_train_batch_size}"
            )
