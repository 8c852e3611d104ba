"""GRPO's sampler/trainer mismatch correction (TRL's `vllm_importance_sampling_*` fields) in real tiny-model
runs: off by default, and when on, it reads the training pass's logprobs against the sampler's, weights the
loss and logs TRL's `sampling/importance_sampling_ratio/*`."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rlhfkit.rewards import KeywordReward
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.trainers.grpo.config import GRPOConfig
from rlhfkit.trainers.grpo.trainer import GRPOTrainer

RATIO = "sampling/importance_sampling_ratio/"


def count_e(completions, **kwargs):
    return KeywordReward("e")(completions)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(padding_side="left")


def _trainer(tmp_path, tokenizer, model=None, **kwargs) -> GRPOTrainer:
    defaults = dict(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=5, max_steps=2, logging_steps=1, save_strategy="no",
        disable_tqdm=True, seed=3, learning_rate=1e-2,
    )  # fmt: skip
    args = GRPOConfig(**{**defaults, **kwargs})
    model = model if model is not None else tiny_model("llama")
    return GRPOTrainer(
        model, count_e, args=args, train_dataset=toy_prompt_dataset(n=16), processing_class=tokenizer
    )


def _shift_sampler_logprobs(trainer, shift: float) -> None:
    """Make the sampler report logprobs `shift` off the model's, as another engine (bf16, vLLM) would."""
    real = trainer._sample_groups

    def shifted():
        groups = real()
        batch = groups.batch
        logprobs = torch.where(batch.response_mask.bool(), batch.logprobs + shift, batch.logprobs)
        return dataclasses.replace(groups, batch=batch.replace(logprobs=logprobs))

    trainer._sample_groups = shifted


def test_off_by_default_as_trl_without_vllm(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer, max_steps=1)
    assert trainer.args.vllm_importance_sampling_correction is None
    assert not trainer.args.sampler_correction_active()
    trainer.train()
    assert trainer._buffer.old_logprobs is None  # no extra forward pass
    assert not any(k.startswith(RATIO) for h in trainer.state.log_history for k in h)


def test_a_mask_that_drops_every_token_stops_learning(tmp_path, tokenizer):
    # the decode loop's logprobs equal the training pass's (ratios ~1): a cap of 0.5 masks every token
    model = tiny_model("llama")
    before = {k: v.clone() for k, v in model.named_parameters()}
    trainer = _trainer(
        tmp_path, tokenizer, model=model, vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_max=0.5,
    )  # fmt: skip
    trainer.train()
    for name, param in model.named_parameters():
        assert torch.equal(before[name], param), f"{name} moved although every token's weight is 0"
    logs = trainer.state.log_history[0]
    assert logs[RATIO + "max"] == 0.0 and logs[RATIO + "mean"] == 0.0 and logs["loss"] == 0.0
    # the same run without the correction learns
    model = tiny_model("llama")
    _trainer(tmp_path, tokenizer, model=model).train()
    assert any(not torch.equal(before[k], v) for k, v in model.named_parameters())


def test_weights_are_pi_old_over_pi_sampler_bounded_by_the_mode(tmp_path, tokenizer):
    # the sampler reports every token ln 2 less likely than the model: each token's ratio is 2
    trainer = _trainer(
        tmp_path, tokenizer, max_steps=1, vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=3.0,
    )  # fmt: skip
    _shift_sampler_logprobs(trainer, -math.log(2.0))
    trainer.train()
    logs = trainer.state.log_history[0]
    for stat in ("min", "mean", "max"):
        assert logs[RATIO + stat] == pytest.approx(2.0, rel=1e-3)
    # the training pass's logprobs are kept as the old policy, the sampler's stay as they were
    batch = trainer._buffer
    mask = batch.loss_mask.bool()
    gap = (batch.old_logprobs - batch.logprobs)[mask]
    assert torch.allclose(gap, torch.full_like(gap, math.log(2.0)), atol=1e-4)
    assert torch.allclose(trainer._sampler_weights(batch)[mask], torch.full_like(gap, 2.0), rtol=1e-3)
    # sequence level: the ratio of a completion is 2 ** its loss tokens; capped at 3 (one token: 2)
    trainer = _trainer(
        tmp_path, tokenizer, max_steps=1, vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="sequence_truncate", vllm_importance_sampling_clip_max=3.0,
    )  # fmt: skip
    _shift_sampler_logprobs(trainer, -math.log(2.0))
    trainer.train()
    lengths = trainer._buffer.loss_mask.sum(1).float()
    expected = torch.clamp(2.0**lengths, max=3.0)
    assert trainer.state.log_history[0][RATIO + "mean"] == pytest.approx(expected.mean().item(), rel=1e-3)


def test_later_updates_use_the_training_pass_as_the_old_policy(tmp_path, tokenizer, monkeypatch):
    import rlhfkit.trainers.grpo.trainer as grpo_module

    seen, real = [], grpo_module.policy_loss
    monkeypatch.setattr(grpo_module, "policy_loss", lambda *a, **k: seen.append(a[2]) or real(*a, **k))
    trainer = _trainer(tmp_path, tokenizer, num_iterations=2, vllm_importance_sampling_correction=True,
                       vllm_importance_sampling_mode="token_truncate")  # fmt: skip
    _shift_sampler_logprobs(trainer, -1.0)
    trainer.train()
    batch = trainer._buffer
    # second pass over the batch: old = the training pass's, not the (shifted) sampler's
    assert torch.equal(seen[1], batch.old_logprobs[: len(seen[1]), : seen[1].shape[1]])
    assert not torch.allclose(seen[1], batch.logprobs[: len(seen[1]), : seen[1].shape[1]])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(vllm_importance_sampling_mode="token"),
            "vllm_importance_sampling_mode must be one of token_truncate",
        ),
        (
            dict(vllm_importance_sampling_clip_max=-1.0),
            "vllm_importance_sampling_clip_max must be a number >= 0",
        ),
        (
            dict(vllm_importance_sampling_clip_min=3.0),
            r"vllm_importance_sampling_clip_min \(3.0\) must be less than "
            r"vllm_importance_sampling_clip_max \(3.0\)",
        ),
        (
            dict(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=None),
            "needs vllm_importance_sampling_clip_min or vllm_importance_sampling_clip_max",
        ),
        (
            dict(loss_type="vespo", vllm_importance_sampling_correction=True),
            "loss_type='vespo' .* must be 'token_truncate' or 'token_mask'",
        ),
    ],
)
def test_bad_settings_name_the_field(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(output_dir=str(tmp_path), **kwargs)


def test_fields_keep_trl_defaults_types_and_deprecated_cap(tmp_path):
    config = GRPOConfig(output_dir=str(tmp_path))
    assert (config.vllm_importance_sampling_mode, config.vllm_importance_sampling_clip_max) == (
        "sequence_mask",
        3.0,
    )
    assert config.vllm_importance_sampling_clip_min is None and config.vllm_importance_sampling_cap is None
    # a mask mode may leave both bounds open, and a correction that is off is not checked for bounds
    GRPOConfig(output_dir=str(tmp_path), vllm_importance_sampling_clip_max=None)
    GRPOConfig(
        output_dir=str(tmp_path), vllm_importance_sampling_correction=False,
        vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=None,
    )  # fmt: skip
    with pytest.warns(FutureWarning, match="vllm_importance_sampling_cap is deprecated"):
        config = GRPOConfig(output_dir=str(tmp_path), vllm_importance_sampling_cap=2.0)
    assert config.vllm_importance_sampling_clip_max == 2.0
    with pytest.raises(TypeError, match="vllm_importance_sampling_clip_max must be float or None"):
        GRPOConfig(output_dir=str(tmp_path), vllm_importance_sampling_clip_max="3")


def test_a_checkpoint_between_two_passes_keeps_the_old_logprobs(tmp_path, tokenizer):
    kwargs = dict(num_iterations=2, max_steps=1, vllm_importance_sampling_correction=True)
    trainer = _trainer(tmp_path, tokenizer, **kwargs)
    trainer.train()  # stops after the first of the batch's two passes
    state = trainer._loop_state()
    resumed = _trainer(tmp_path, tokenizer, **kwargs)
    resumed._load_loop_state(state)
    assert torch.equal(resumed._buffer.old_logprobs, trainer._buffer.old_logprobs)
    assert torch.equal(resumed._buffer.logprobs, trainer._buffer.logprobs)
