"""What the TrainingArguments-based configs (reward, SFT, DPO, RLOO) declare alike, written once.

`HFTrainerConfig` holds the non-finite-step budget and the `__post_init__` order every one of them
follows (field types, then TrainingArguments, then the config's own `validate`, which the trainers
run again after keyword overrides). `ModelInitKwargs` adds `model_init_kwargs` to the configs whose
trainer loads a model given as a path with the config's keywords.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments

from rlhfkit.trainers.config_checks import check_field_types
from rlhfkit.trainers.legacy_training_args import LegacyTrainingArguments


@dataclass
class HFTrainerConfig(LegacyTrainingArguments):
    """Base of the Trainer-style configs; a subclass checks its own fields in `validate`."""

    max_consecutive_nonfinite_steps: int = field(
        default=3,
        metadata={
            "help": "Optimizer steps with a NaN/inf loss or gradient are skipped; after this many in a row "
            "the run saves its last good state and stops with an error."
        },
    )

    def __post_init__(self):
        check_field_types(self, skip_fields_of=TrainingArguments)
        super().__post_init__()
        self.validate()

    def validate(self) -> None:
        """Check the config's own fields; also called again after a trainer's keyword overrides."""


@dataclass
class ModelInitKwargs:
    """Mixin field for configs whose trainer accepts `model` as a path."""

    model_init_kwargs: dict[str, Any] | None = field(
        default=None,
        metadata={"help": "Keyword arguments for from_pretrained when `model` is a path string."},
    )
