"""RLOOTrainer in TRL 1.x's form (GRPO-shaped), beside the classic form it shares a name and a config with:
which form a call picks, the config's per-form defaults and conflicts, the KL inside the reward, the
clipping and normalisation options taking effect, TRL's own call with paths only, and learning."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

from rlhfkit import GRPOTrainer, RLOOConfig, RLOOTrainer
from rlhfkit.core import leave_one_out_advantages
from rlhfkit.rewards import KeywordReward
from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_model_path, tiny_tokenizer
from rlhfkit.trainers.rloo.current import GroupRLOOTrainer
from rlhfkit.trainers.rloo.trainer import ClassicRLOOTrainer


def count_e(completions, **kwargs):
    return KeywordReward("e")(completions)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(padding_side="left")


def _config(tmp_path, **kwargs) -> RLOOConfig:
    defaults = dict(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=5, max_steps=2, logging_steps=1, save_strategy="no",
        disable_tqdm=True, seed=3, learning_rate=1e-3,
    )  # fmt: skip
    return RLOOConfig(**{**defaults, **kwargs})


def _trainer(tmp_path, tokenizer, dataset=None, **kwargs) -> GroupRLOOTrainer:
    return RLOOTrainer(
        model=tiny_model("llama"),
        reward_funcs=count_e,
        args=_config(tmp_path, **kwargs),
        train_dataset=dataset if dataset is not None else toy_prompt_dataset(n=16),
        processing_class=tokenizer,
    )


def _logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


# ---------------------------------------------------------------- which form
def test_the_arguments_pick_the_form(tmp_path, tokenizer):
    current = _trainer(tmp_path, tokenizer)
    assert type(current) is GroupRLOOTrainer and isinstance(current, RLOOTrainer)
    assert isinstance(current, GRPOTrainer) and current.args.form == "current"
    classic = RLOOTrainer(
        config=RLOOConfig(output_dir=str(tmp_path / "c"), report_to="none", per_device_train_batch_size=4),
        processing_class=tokenizer, policy=tiny_model("llama"), ref_policy=None,
        reward_model=tiny_model("llama-reward"), train_dataset=toy_prompt_dataset(n=8),
    )  # fmt: skip
    assert type(classic) is ClassicRLOOTrainer and isinstance(classic, RLOOTrainer)
    assert classic.args.form == "classic" and classic.args.temperature == 0.7


def test_mixed_or_missing_arguments_are_refused(tokenizer):
    with pytest.raises(TypeError, match="policy.*reward_funcs|reward_funcs.*policy"):
        RLOOTrainer(policy=tiny_model("llama"), reward_funcs=count_e)
    with pytest.raises(TypeError, match="needs either model= and reward_funcs="):
        RLOOTrainer()


def test_per_form_defaults_and_conflicting_fields(tmp_path, tokenizer):
    neutral = RLOOConfig(output_dir="x", report_to="none")
    assert neutral.form is None and neutral.temperature is None and neutral.learning_rate is None
    current = RLOOConfig(output_dir="x", report_to="none", num_generations=4)
    assert current.form == "current" and (current.temperature, current.learning_rate) == (1.0, 1e-6)
    assert current.generation_batch_size == 8 and current.steps_per_generation == 1
    with pytest.raises(ValueError, match="rloo_k belongs to the classic form.*beta to the current form"):
        RLOOConfig(output_dir="x", report_to="none", rloo_k=4, beta=0.1)
    classic_config = RLOOConfig(output_dir=str(tmp_path), report_to="none", kl_coef=0.1)
    with pytest.raises(ValueError, match="config sets kl_coef, a field of the classic form"):
        RLOOTrainer(model=tiny_model("llama"), reward_funcs=count_e, args=classic_config,
                    train_dataset=toy_prompt_dataset(n=8), processing_class=tokenizer)  # fmt: skip
    with pytest.raises(ValueError, match="must be a multiple of num_generations"):
        RLOOConfig(output_dir="x", report_to="none", num_generations=3, per_device_train_batch_size=8)
    with pytest.raises(ValueError, match="min < max"):
        RLOOConfig(output_dir="x", report_to="none", num_generations=4, reward_clip_range=[2.0, 1.0])
    with pytest.raises(ValueError, match="one number c > 0 in the classic form"):
        RLOOConfig(output_dir="x", report_to="none", rloo_k=4, reward_clip_range=[-1.0, 1.0])
    symmetric = RLOOConfig(output_dir="x", report_to="none", num_generations=4, reward_clip_range=[3.0])
    assert symmetric.reward_clip_bounds == (-3.0, 3.0)


# ---------------------------------------------------------------- the maths inside the trainer
def _batch(logprobs, ref_logprobs, mask):
    rows, length = logprobs.shape
    ids = torch.zeros(rows, length, dtype=torch.long)
    ones = torch.ones(rows, 1, dtype=torch.bool)
    return RolloutBatch(ids[:, :1], ones, ids, mask, mask, logprobs=logprobs, ref_logprobs=ref_logprobs)


def test_the_summed_k1_kl_is_taken_from_the_reward(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer, beta=0.5, per_device_train_batch_size=4)
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0], [-0.5, -0.5, -9.0], [-2.0, -2.0, -2.0]])
    ref = torch.full_like(logprobs, -1.5)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    scores = torch.tensor([1.0, 2.0, 3.0, 4.0])
    advantages, metrics = trainer._advantages(_batch(logprobs, ref, mask), scores)
    # summed k1 per row, by hand: (0.5-0.5-1.5), (0.5+0.5), (1+1), (-0.5*3); rows 2, 3 mask their third token
    kl = torch.tensor([-1.5, 1.0, 2.0, -1.5])
    torch.testing.assert_close(advantages, leave_one_out_advantages(scores - 0.5 * kl, 4))
    assert metrics["kl"] == pytest.approx(kl.sum().item() / 10)  # per completion token: 10 tokens


def test_reward_clip_range_and_normalize_advantages_take_effect(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer, beta=0.0, per_device_train_batch_size=4,
                       reward_clip_range=[0.0, 2.0], normalize_advantages=True)  # fmt: skip
    scores = torch.tensor([-3.0, 1.0, 5.0, 2.0])
    zeros = torch.zeros(4, 2)
    advantages, metrics = trainer._advantages(_batch(zeros, None, zeros.bool()), scores)
    clipped = torch.tensor([0.0, 1.0, 2.0, 2.0])
    torch.testing.assert_close(advantages, leave_one_out_advantages(clipped, 4, normalize=True))
    assert "kl" not in metrics and trainer.reference is None


# ---------------------------------------------------------------- as TRL's users call it
def test_trl_call_with_paths_only_trains_every_parameter(tmp_path):
    dataset = Dataset.from_dict({"prompt": ["the cat sat on", "a dog ran to", "once upon a time"] * 3})
    args = RLOOConfig(output_dir=str(tmp_path), learning_rate=0.1, per_device_train_batch_size=3,
                      num_generations=3, max_completion_length=8, report_to="none", max_steps=2)  # fmt: skip
    trainer = RLOOTrainer(
        model=str(tiny_model_path("llama")),
        reward_funcs=str(tiny_model_path("llama-reward")),
        args=args,
        train_dataset=dataset,
    )
    before = {n: p.clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.reference is not None  # beta 0.05 by default
    for name, param in trainer.model.named_parameters():
        assert not torch.equal(param, before[name]), f"{name} did not change"
    assert {"reward", "kl", "entropy", "clip_ratio/region_mean", "loss"} <= set(trainer.state.log_history[0])


def test_reward_rises_on_a_learnable_task(tmp_path, tokenizer):
    # reward: occurrences of "e" in the completion, capped at 5; a random model scores ~2
    trainer = _trainer(
        tmp_path, tokenizer, dataset=toy_prompt_dataset(n=200), per_device_train_batch_size=16,
        max_completion_length=6, learning_rate=3e-3, max_steps=25, lr_scheduler_type="constant", seed=0,
        beta=0.01,
    )  # fmt: skip
    trainer.train()
    rewards = _logged(trainer, "reward")
    before, after = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"keyword reward: first 5 updates {before:.2f}, last 5 updates {after:.2f}")
    assert after > before + 1.0, rewards
