"""Arguments for a few CPU steps of a tiny model: what the tests and examples train with."""

from __future__ import annotations

import os
from typing import Any

FEW_STEPS = dict(
    use_cpu=True,
    report_to="none",
    max_steps=2,
    per_device_train_batch_size=4,
    per_device_eval_batch_size=8,
    save_strategy="no",
    logging_steps=1,
    learning_rate=1e-3,
    seed=0,
)


def few_step_args(config_cls: type, output_dir: str | os.PathLike, **overrides: Any) -> Any:
    """`config_cls` (transformers.TrainingArguments or a subclass) set for 2 logged CPU steps, no saving.

    Keywords override the defaults (any field of `config_cls`).
    """
    return config_cls(output_dir=str(output_dir), **{**FEW_STEPS, **overrides})
