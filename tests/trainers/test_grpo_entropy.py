"""GRPOTrainer's entropy bonus (`entropy_coef`) and Skywork-OR1's adaptive coefficient: the bonus adds exactly
-coef * grad(mean entropy) to the update (padded and chunked heads), the adaptive coefficient moves toward
its target within its bounds, is applied only at or below it, and survives a resume."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.core.masking import masked_mean
from rlhfkit.rewards import KeywordReward
from rlhfkit.rollout import forward_response
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.trainers.grpo.config import GRPOConfig
from rlhfkit.trainers.grpo.trainer import GRPOTrainer


def count_e(completions, **kwargs):
    return KeywordReward("e")(completions)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(padding_side="left")


def _trainer(tmp_path, tokenizer, **kwargs) -> GRPOTrainer:
    defaults = dict(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=5, max_steps=2, logging_steps=1, save_strategy="no",
        disable_tqdm=True, seed=3, learning_rate=1e-3,
    )  # fmt: skip
    args = GRPOConfig(**{**defaults, **kwargs})
    return GRPOTrainer(
        tiny_model("llama"),
        count_e,
        args=args,
        train_dataset=toy_prompt_dataset(n=16),
        processing_class=tokenizer,
    )


def _grads(trainer, batch):
    trainer.model.zero_grad()
    trainer._micro_step(trainer.model, batch, float(batch.loss_mask.sum()), len(batch))
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters()])


@pytest.mark.parametrize("head", ["padded", "chunked"])
def test_entropy_coef_adds_minus_coef_times_the_entropy_gradient(tmp_path, tokenizer, head, request):
    if head == "chunked":
        request.getfixturevalue("chunk_calls")  # every forward through the chunked lm-head path
    trainer = _trainer(tmp_path, tokenizer, entropy_coef=0.3)
    batch, _ = trainer._rollout(0)
    with_bonus = _grads(trainer, batch)
    trainer.entropy_control.coef = 0.0
    without = _grads(trainer, batch)
    # the bonus alone: -0.3 * mean entropy over the trained tokens, differentiated
    trainer.model.zero_grad()
    out = forward_response(
        trainer.model, *trainer._rollout_tensors(batch), with_entropy=True, entropy_grad=True
    )
    (-0.3 * masked_mean(out.entropy, batch.loss_mask.bool())).backward()
    bonus = torch.cat([p.grad.flatten() for p in trainer.model.parameters()])
    assert bonus.abs().max() > 1e-4  # the entropy term really moves the parameters
    torch.testing.assert_close(with_bonus - without, bonus, atol=1e-6, rtol=1e-4)


def test_a_fixed_coefficient_is_logged_and_lowers_the_loss_below_the_policy_loss(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer, entropy_coef=0.5)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "entropy_coef" in h]
    assert [h["entropy_coef"] for h in logs] == [0.5, 0.5]
    for h in logs:  # loss = policy_loss - 0.5 * (mean entropy of the trained tokens) > 0
        assert h["loss"] < h["policy_loss"]


def test_adaptive_coefficient_rises_toward_a_target_above_the_entropy(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer, max_steps=3, use_adaptive_entropy=True, entropy_coef=0.1,
                       entropy_coef_delta=0.05, entropy_coef_max=0.2, entropy_target=100.0)  # fmt: skip
    trainer.train()
    logs = [h for h in trainer.state.log_history if "entropy_coef" in h]
    assert [h["entropy_coef"] for h in logs] == pytest.approx([0.15, 0.2, 0.2])  # capped at the max
    assert logs[0]["loss"] == pytest.approx(logs[0]["policy_loss"])  # step 1: nothing measured, no bonus
    assert logs[1]["loss"] < logs[1]["policy_loss"]  # then 0.15 applies: the entropy is below the target


def test_adaptive_coefficient_falls_and_stays_off_above_the_target(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer, max_steps=3, use_adaptive_entropy=True, entropy_coef=0.06,
                       entropy_coef_delta=0.05, entropy_target=0.0)  # fmt: skip
    trainer.train()
    logs = [h for h in trainer.state.log_history if "entropy_coef" in h]
    assert [h["entropy_coef"] for h in logs] == pytest.approx([0.01, 0.0, 0.0])  # floored at the min
    assert all(h["loss"] == pytest.approx(h["policy_loss"]) for h in logs)  # never applied


def test_adaptive_coefficient_survives_a_resume(tmp_path, tokenizer):
    options = dict(use_adaptive_entropy=True, entropy_coef=0.1, entropy_coef_delta=0.05, entropy_target=100.0)
    _trainer(tmp_path, tokenizer, save_strategy="steps", save_steps=1, **options).train()
    resumed = _trainer(tmp_path, tokenizer, max_steps=3, **options)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert [h["entropy_coef"] for h in resumed.state.log_history if "entropy_coef" in h][-1] == pytest.approx(
        0.25
    )


def test_entropy_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="entropy_coef_max must be >= entropy_coef_min"):
        GRPOConfig(output_dir=str(tmp_path), entropy_coef_min=0.5, entropy_coef_max=0.1)
    with pytest.raises(ValueError, match="entropy_coef_delta must be >= 0"):
        GRPOConfig(output_dir=str(tmp_path), entropy_coef_delta=-1.0)
