"""TRL 1.16's GRPOTrainer surface beyond training, as TRL's users call it: the public helpers on the class,
the attributes they read, the keywords reward functions receive and the metrics of the run's last log entry.
One test per behaviour, each checking what the thing does."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer

from rlhfkit import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer
from rlhfkit.testing import tiny_model_path


def reward_len(completions, **kwargs):
    return [float(len(c)) for c in completions]


def _prompts(n=8):
    return Dataset.from_dict({"prompt": [f"The story number {i} begins" for i in range(n)]})


def _config(tmp_path, config=GRPOConfig, **kwargs):
    common = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
        max_completion_length=6, max_steps=2, report_to="none", logging_steps=1, use_cpu=True,
        learning_rate=1e-3, save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    return config(**{**common, **kwargs})


def _trainer(tmp_path, reward_funcs=reward_len, trainer=GRPOTrainer, config=GRPOConfig, **kwargs):
    return trainer(
        model=str(tiny_model_path("llama")),
        reward_funcs=reward_funcs,
        args=_config(tmp_path, config, **kwargs),
        train_dataset=_prompts(),
    )


def _one_process():
    accelerator = SimpleNamespace(gather=lambda t: t, pad_across_processes=lambda t, dim, pad_index: t)
    return SimpleNamespace(accelerator=accelerator)


def test_get_high_entropy_mask_keeps_tokens_at_or_above_the_threshold_quantile():
    entropies = torch.tensor([[0.1, 0.4, 0.9], [0.3, 2.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # masked values 0.1, 0.3, 0.4, 0.9, 2.0: the 0.5 quantile is 0.4; 5.0 is padding and never kept
    keep = GRPOTrainer.get_high_entropy_mask(_one_process(), entropies, mask, 0.5)
    assert keep.tolist() == [[False, True, True], [False, True, False]]
    # threshold 1.0: only the largest masked entropy; nothing masked in: nothing kept
    keep = GRPOTrainer.get_high_entropy_mask(_one_process(), entropies, mask, 1.0)
    assert keep.tolist() == [[False, False, False], [False, True, False]]
    nothing = GRPOTrainer.get_high_entropy_mask(_one_process(), entropies, torch.zeros_like(mask), 0.5)
    assert not nothing.any()


def test_get_off_policy_mask_drops_negative_advantages_that_drifted_too_far():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    sampling = torch.zeros(3, 3)
    # mean drift over the mask: row 0 (3 + 1) / 2 = 2 (the 100 is padding), row 1 0.5, row 2 2
    current = torch.tensor([[-3.0, -1.0, -100.0], [-0.5, -0.5, -0.5], [-2.0, -2.0, -2.0]])
    advantages = torch.tensor([[-1.0], [-1.0], [1.0]])
    keep = GRPOTrainer.get_off_policy_mask(advantages, current, sampling, mask, 1.0)
    assert keep.shape == (3, 1) and keep.dtype == mask.dtype
    assert keep.flatten().tolist() == [0.0, 1.0, 1.0]  # row 2 drifted but its advantage is positive


def test_reward_processing_classes_one_per_reward_function(tmp_path):
    rm = str(tiny_model_path("llama-reward"))
    own = AutoTokenizer.from_pretrained(rm)
    trainer = _trainer(tmp_path, reward_funcs=[rm, reward_len])
    assert len(trainer.reward_processing_classes) == 2
    assert trainer.reward_processing_classes[1] is None  # a function has no tokenizer
    single = GRPOTrainer(
        model=str(tiny_model_path("llama")), reward_funcs=rm, args=_config(tmp_path),
        train_dataset=_prompts(), reward_processing_classes=own,
    )  # fmt: skip
    assert single.reward_processing_classes == [own]
    with pytest.raises(ValueError, match="reward_processing_classes has 1 entries for 2 reward functions"):
        GRPOTrainer(
            model=str(tiny_model_path("llama")), reward_funcs=[rm, rm], args=_config(tmp_path),
            train_dataset=_prompts(), reward_processing_classes=own,
        )  # fmt: skip


def test_ref_model_is_the_reference_and_moves_with_sync_ref_model(tmp_path):
    assert _trainer(tmp_path).ref_model is None  # beta = 0: no reference at all
    trainer = _trainer(tmp_path, beta=0.1, sync_ref_model=True, ref_model_sync_steps=1, learning_rate=1e-2)
    before = {n: p.clone() for n, p in trainer.ref_model.named_parameters()}
    trainer.train()
    moved = [n for n, p in trainer.ref_model.named_parameters() if not torch.equal(before[n], p)]
    assert moved and not any(p.requires_grad for p in trainer.ref_model.parameters())


def test_reward_functions_get_trainer_state_log_metric_and_log_extra(tmp_path):
    steps = []

    def reward(completions, trainer_state, log_metric, log_extra, **kwargs):
        steps.append(trainer_state.global_step)
        log_metric("custom/rows", len(completions))
        log_metric("custom/mean", 1.0)  # two calls in one batch: their mean is logged
        log_metric("custom/mean", 3.0)
        log_extra("first_letter", [c[:1] for c in completions])
        return [float(len(c)) for c in completions]

    def plain(completions, prompts, completion_ids, **_):  # no extra keywords wanted: none forced on it
        return [0.0] * len(completions)

    trainer = _trainer(tmp_path, reward_funcs=[reward, plain], log_completions=True)
    trainer.train()
    assert steps == [0, 1]  # the state of the update the completions are sampled for
    logged = [h for h in trainer.state.log_history if "custom/rows" in h]
    assert len(logged) >= 2
    assert all(h["custom/rows"] == 4 and h["custom/mean"] == 2.0 for h in logged)
    rows = [json.loads(line) for line in open(tmp_path / "out" / "samples.jsonl")]
    assert rows and all(isinstance(r["first_letter"], str) and len(r["first_letter"]) <= 1 for r in rows)


def test_the_last_log_entry_carries_the_metrics_of_unlogged_updates(tmp_path):
    trainer = _trainer(
        tmp_path, reward_funcs=[reward_len, lambda completions, **_: [1.0] * len(completions)],
        reward_weights=[0.0, 0.7], logging_steps=10, max_steps=3, entropy_coef=0.01,
    )  # fmt: skip
    trainer.train()
    last = trainer.state.log_history[-1]
    assert "train_loss" in last and len(trainer.state.log_history) == 1  # no update reached logging_steps
    assert last["reward"] == pytest.approx(0.7)  # weighted: 0 * length + 0.7 * 1
    assert last["rewards/<lambda>/mean"] == pytest.approx(1.0)
    assert "policy_loss" in last and last["entropy_coef"] == pytest.approx(0.01)
    assert trainer.entropy_coef == pytest.approx(0.01)


def test_rloo_current_form_has_the_same_surface(tmp_path):
    trainer = _trainer(tmp_path, trainer=RLOOTrainer, config=RLOOConfig, beta=0.05, logging_steps=10)
    assert trainer.reward_processing_classes == [None] and trainer.ref_model is not None
    trainer.train()
    assert trainer.state.log_history[-1]["reward"] > 0


def test_eval_dataset_is_kept_as_given_and_a_stream_is_evaluated_whole(tmp_path):
    from datasets import IterableDatasetDict

    eval_set = _prompts(3)
    trainer = GRPOTrainer(
        model=str(tiny_model_path("llama")), reward_funcs=reward_len, train_dataset=_prompts(),
        args=_config(tmp_path, num_generations_eval=2, per_device_eval_batch_size=4), eval_dataset=eval_set,
    )  # fmt: skip
    assert trainer.eval_dataset is eval_set  # the tokenised prompts are kept apart
    metrics = trainer.evaluate()
    assert metrics["eval_completions/mean_length"] > 0 and "eval_loss" in metrics
    # at ratio 1 the loss is a length-weighted mean of -A over standardised advantages: |loss| <= max |A|
    assert math.isfinite(metrics["eval_loss"]) and abs(metrics["eval_loss"]) < 2.5
    streams = IterableDatasetDict(
        {"a": _prompts(2).to_iterable_dataset(), "b": eval_set.to_iterable_dataset()}
    )
    named = trainer.evaluate(streams)
    assert {"eval_a_loss", "eval_b_loss", "eval_a_reward", "eval_b_reward"} <= named.keys()


def test_eval_loss_is_the_training_loss_of_the_sampled_groups(tmp_path):
    # every completion gets the same reward: zero advantages, so the loss is exactly beta * KL = 0 at start
    trainer = GRPOTrainer(
        model=str(tiny_model_path("llama")), reward_funcs=lambda completions, **_: [1.0] * len(completions),
        train_dataset=_prompts(), args=_config(tmp_path, beta=0.1), eval_dataset=_prompts(2),
    )  # fmt: skip
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] == pytest.approx(0.0, abs=1e-6)  # the reference is the policy itself


def test_beam_search_generation_kwargs_train(tmp_path):
    trainer = _trainer(tmp_path, generation_kwargs={"num_beams": 2, "do_sample": False})
    before = {n: p.clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    assert all(math.isfinite(h["loss"]) for h in trainer.state.log_history if "loss" in h)


def test_train_dataset_is_required(tmp_path):
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        GRPOTrainer(model=str(tiny_model_path("llama")), reward_funcs=reward_len, args=_config(tmp_path))


def test_eval_loss_with_one_completion_per_prompt_has_no_advantage(tmp_path):
    trainer = GRPOTrainer(
        model=str(tiny_model_path("llama")), reward_funcs=reward_len, train_dataset=_prompts(),
        args=_config(tmp_path, num_generations_eval=1), eval_dataset=_prompts(2),
    )  # fmt: skip
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] == 0.0  # beta = 0 and advantage 0: nothing to learn from a lone completion
    assert metrics["eval_reward"] > 0
