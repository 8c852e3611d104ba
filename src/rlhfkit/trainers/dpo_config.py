"""DPOConfig: TrainingArguments plus direct preference optimisation options (seed 001's DPOTrainer)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhfkit.trainers.hf_trainer_config import HFTrainerConfig, ModelInitKwargs

TRUNCATION_MODES = ("keep_end", "keep_start")


@dataclass
class DPOConfig(ModelInitKwargs, HFTrainerConfig):
    """Configuration for `DPOTrainer`; every `transformers.TrainingArguments` field also applies."""

    beta: float = field(
        default=0.1,
        metadata={
            "help": "Strength of the implicit KL to the reference: larger beta keeps the policy closer."
        },
    )
    loss_type: str = field(
        default="sigmoid", metadata={"help": "DPO loss variant: 'sigmoid' (DPO), 'hinge' (SLiC) or 'ipo'."}
    )
    label_smoothing: float = field(
        default=0.0,
        metadata={
            "help": "Assumed probability that a preference label is flipped (conservative DPO), in [0, 0.5)."
        },
    )
    reference_free: bool = field(
        default=False,
        metadata={"help": "Use a uniform reference (reference log-probs = 0) instead of a model."},
    )
    max_length: int | None = field(
        default=512, metadata={"help": "Longest prompt + response, in tokens. None: no limit."}
    )
    max_prompt_length: int | None = field(
        default=128,
        metadata={
            "help": "Prompt tokens kept when prompt + response is longer than max_length. None: no limit."
        },
    )
    truncation_mode: str = field(
        default="keep_end",
        metadata={
            "help": "Which prompt tokens to keep when truncating: 'keep_end' (latest) or 'keep_start'."
        },
    )
    label_pad_token_id: int = field(
        default=-100, metadata={"help": "Label value for positions that carry no loss (prompt and padding)."}
    )
    padding_value: int | None = field(
        default=None, metadata={"help": "Token id used to pad input_ids. None: the tokenizer's pad token."}
    )
    disable_dropout: bool = field(
        default=True, metadata={"help": "Set dropout to 0 in the policy and reference models."}
    )
    precompute_ref_log_probs: bool = field(
        default=False,
        metadata={
            "help": "Compute reference log-probs once over the datasets, so a step runs only the policy."
        },
    )
    generate_during_eval: bool = field(
        default=False, metadata={"help": "Log a few policy and reference generations at every evaluation."}
    )
    max_new_tokens_eval: int = field(
        default=32, metadata={"help": "New tokens per generation when generate_during_eval is on."}
    )
    dataset_num_proc: int | None = field(default=None, metadata={"help": "Worker processes for tokenising."})
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Kept False: the pair columns are not arguments of forward()."}
    )

    def validate(self) -> None:
        from rlhfkit.core.losses import DPO_LOSSES

        if self.loss_type not in DPO_LOSSES:
            raise ValueError(f"loss_type must be one of {sorted(DPO_LOSSES)}, got {self.loss_type!r}")
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if self.truncation_mode not in TRUNCATION_MODES:
            raise ValueError(
                f"truncation_mode must be one of {TRUNCATION_MODES}, got {self.truncation_mode!r}"
            )
        if self.max_length is not None and self.max_prompt_length is not None:
            if self.max_prompt_length >= self.max_length:
                raise ValueError(
                    f"max_prompt_length ({self.max_prompt_length}) must be smaller than max_length "
                    f"({self.max_length}) to leave room for the response"
                )
