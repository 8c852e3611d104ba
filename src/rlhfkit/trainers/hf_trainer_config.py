"""What the TrainingArguments-based configs (reward, SFT, DPO, RLOO) declare alike, written once.

`HFTrainerConfig` holds the non-finite-step budget and the `__post_init__` order every one of them
follows (field types, then TrainingArguments, then the config's own `validate`, which the trainers
run again after keyword overrides). The mixins add fields several of these configs share:
`ModelInitKwargs` for trainers that load a model given as a path with the config's keywords,
`DatasetNumProc` and `TokenizesDatasets` for trainers that tokenise their datasets themselves,
`MaxLength` for those that cut their sequences at one length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import TrainingArguments

from rlhfkit.trainers.config_checks import check_field_types
from rlhfkit.trainers.config_fields import NonfiniteStepLimit, option
from rlhfkit.trainers.legacy_training_args import LegacyTrainingArguments


@dataclass
class HFTrainerConfig(NonfiniteStepLimit, LegacyTrainingArguments):
    """Base of the Trainer-style configs; a subclass checks its own fields in `validate`."""

    def __post_init__(self):
        check_field_types(self, skip_fields_of=TrainingArguments)
        super().__post_init__()
        self.validate()

    def validate(self) -> None:
        """Check the config's own fields; also called again after a trainer's keyword overrides."""


@dataclass
class ModelInitKwargs:
    """Mixin field for configs whose trainer accepts `model` as a path."""

    model_init_kwargs: dict[str, Any] | None = option(
        None, "Keyword arguments for from_pretrained when `model` is a path string."
    )


@dataclass
class DatasetNumProc:
    """Mixin field for configs whose trainer tokenises its datasets with `datasets.map`."""

    dataset_num_proc: int | None = option(None, "Worker processes for tokenising the datasets (None: this one).")


@dataclass
class TokenizesDatasets(DatasetNumProc):
    """Mixin fields for configs whose trainer turns raw text columns into its own model inputs."""

    remove_unused_columns: bool = option(
        False, "Kept False: the trainer picks the columns it needs; they are not all forward() arguments."
    )


@dataclass
class MaxLength:
    """Mixin field for configs that cut each tokenised sequence at one length."""

    max_length: int | None = option(
        512, "Longest tokenised sequence, prompt included (each side of a pair). None: no limit."
    )
