"""TRL 1.x's RLOOTrainer (the GRPO-shaped form), called as TRL 1.16 documents it with only the import
changed: the behaviours TRL's own RLOO tests check that this form shares with GRPOTrainer's set-up."""

from __future__ import annotations

import pytest
from datasets import Dataset

from rlhfkit import RLOOConfig, RLOOTrainer
from rlhfkit.testing import tiny_model_path


def count_e(completions, **kwargs):
    return [float(completion.count("e")) for completion in completions]


def _prompts(n=8):
    return Dataset.from_dict({"prompt": [f"The story number {i} begins" for i in range(n)]})


def _config(tmp_path, **kwargs):
    common = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
        max_completion_length=6, max_steps=1, report_to="none", use_cpu=True, save_strategy="no",
        disable_tqdm=True,
    )  # fmt: skip
    return RLOOConfig(**{**common, **kwargs})


def test_train_dataset_is_required(tmp_path):
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        RLOOTrainer(model=str(tiny_model_path("llama")), reward_funcs=count_e, args=_config(tmp_path))


def test_iterable_eval_set_gets_a_single_worker_loader_and_train_keeps_its_workers(tmp_path):
    trainer = RLOOTrainer(
        model=str(tiny_model_path("llama")),
        reward_funcs=count_e,
        args=_config(tmp_path, dataloader_num_workers=2, per_device_eval_batch_size=4),
        train_dataset=_prompts(),
        eval_dataset=_prompts(4).to_iterable_dataset(),
    )
    assert trainer.get_eval_dataloader().num_workers == 0
    assert trainer.args.dataloader_num_workers == 2
    assert trainer.get_train_dataloader().num_workers == 2
