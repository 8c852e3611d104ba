"""A streamed train set (`datasets.IterableDataset`) for GRPOTrainer and RLOO's current form: trains for
max_steps, reads the prompts in the stream's order across epochs, resumes where it stopped, and fails
clearly without max_steps, with too few prompts, or as an evaluation set."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

from rlhfkit import RLOOConfig, RLOOTrainer
from rlhfkit.rewards import KeywordReward
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.trainers.grpo.config import GRPOConfig
from rlhfkit.trainers.grpo.trainer import GRPOTrainer


def count_e(completions, **kwargs):
    return KeywordReward("e")(completions)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(padding_side="left")


def _args(tmp_path, config=GRPOConfig, **kwargs):
    defaults = dict(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=4, max_steps=2, logging_steps=1, save_strategy="no",
        disable_tqdm=True, seed=3, learning_rate=1e-3, shuffle_dataset=False,
    )  # fmt: skip
    return config(**{**defaults, **kwargs})


def _stream(n=6):
    """n prompts numbered in their text, streamed."""
    return Dataset.from_dict({"prompt": [f"prompt {i} says" for i in range(n)]}).to_iterable_dataset()


def _grpo(tmp_path, tokenizer, dataset, **kwargs):
    args = _args(tmp_path, **kwargs)
    model = tiny_model("llama")
    return GRPOTrainer(model, count_e, args=args, train_dataset=dataset, processing_class=tokenizer)


def _seen_prompts(trainer):
    seen = []
    real = trainer._score_groups

    def record(rows, num_generations):
        seen.append(list(rows["prompt"]))
        return real(rows, num_generations)

    trainer._score_groups = record
    return seen


def test_a_streamed_train_set_trains_for_max_steps_in_stream_order(tmp_path, tokenizer):
    model = tiny_model("llama")
    before = {k: v.clone() for k, v in model.named_parameters()}
    trainer = GRPOTrainer(
        model,
        count_e,
        args=_args(tmp_path, max_steps=4),
        train_dataset=_stream(5),
        processing_class=tokenizer,
    )
    seen = _seen_prompts(trainer)
    trainer.train()
    assert trainer.state.global_step == 4
    # 2 prompts per generation batch, in order; the fifth prompt is the epoch's partial batch, dropped
    assert seen == [["prompt 0 says", "prompt 1 says"], ["prompt 2 says", "prompt 3 says"]] * 2
    assert any(not torch.equal(before[k], v) for k, v in model.named_parameters())


def test_a_resumed_stream_continues_with_the_next_prompts(tmp_path, tokenizer):
    args = _args(tmp_path, max_steps=2, save_strategy="steps", save_steps=1)
    first = GRPOTrainer(
        tiny_model("llama"), count_e, args=args, train_dataset=_stream(), processing_class=tokenizer
    )
    first.train()
    args = _args(tmp_path, max_steps=3)
    resumed = GRPOTrainer(
        tiny_model("llama"), count_e, args=args, train_dataset=_stream(), processing_class=tokenizer
    )
    seen = _seen_prompts(resumed)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert seen == [["prompt 4 says", "prompt 5 says"]]


def test_rloo_current_form_takes_a_stream_too(tmp_path, tokenizer):
    trainer = RLOOTrainer(
        model=tiny_model("llama"), reward_funcs=count_e, args=_args(tmp_path, RLOOConfig),
        train_dataset=_stream(), processing_class=tokenizer,
    )  # fmt: skip
    trainer.train()
    assert trainer.state.global_step == 2


def test_stream_errors_name_what_is_missing(tmp_path, tokenizer):
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="IterableDataset.*set max_steps"):
        GRPOTrainer(model, count_e, args=_args(tmp_path, max_steps=-1), train_dataset=_stream(),
                    processing_class=tokenizer)  # fmt: skip
    dispatched = _args(tmp_path, accelerator_config={"dispatch_batches": True})
    with pytest.raises(ValueError, match="dispatch_batches=True does not go with a streamed train_dataset"):
        GRPOTrainer(model, count_e, args=dispatched, train_dataset=_stream(), processing_class=tokenizer)
    streamed = GRPOTrainer(model, count_e, args=_args(tmp_path, dataloader_num_workers=2),
                           train_dataset=_stream(), processing_class=tokenizer)  # fmt: skip
    # each process reads its own share: nothing dispatched, no dataloader workers
    assert streamed.args.accelerator_config.dispatch_batches is False
    assert streamed.args.dataloader_num_workers == 0
    short = GRPOTrainer(
        model, count_e, args=_args(tmp_path), train_dataset=_stream(1), processing_class=tokenizer
    )
    with pytest.raises(ValueError, match="yields 1 prompts in a whole pass.*needs 2"):
        short.train()
    no_prompt = Dataset.from_dict({"text": ["a", "b", "c"]}).to_iterable_dataset()
    trainer = GRPOTrainer(
        model, count_e, args=_args(tmp_path), train_dataset=no_prompt, processing_class=tokenizer
    )
    with pytest.raises(ValueError, match="'prompt' column"):
        trainer.train()


def test_a_map_style_dataset_is_unchanged(tmp_path, tokenizer):
    trainer = GRPOTrainer(
        tiny_model("llama"), count_e, args=_args(tmp_path), train_dataset=toy_prompt_dataset(n=4),
        processing_class=tokenizer,
    )  # fmt: skip
    assert trainer.prompts.rows(0)["prompt"] == toy_prompt_dataset(n=4)["prompt"][:2]
