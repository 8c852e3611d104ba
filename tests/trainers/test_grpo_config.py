"""GRPOConfig: TRL's names and defaults, the derived generation sizes, and errors that name the field."""

from __future__ import annotations

import pytest

from rlhfkit.trainers.grpo.config import GRPOConfig


def _config(**kwargs) -> GRPOConfig:
    defaults = dict(output_dir="unused", report_to="none", use_cpu=True, per_device_train_batch_size=8)
    return GRPOConfig(**{**defaults, **kwargs})


def test_defaults_follow_trl():
    config = _config()
    expected = dict(
        num_generations=8, max_completion_length=512, temperature=1.0, top_p=1.0, top_k=0, min_p=None,
        repetition_penalty=1.0, beta=0.0, num_iterations=1, epsilon=0.2, epsilon_high=None, delta=None,
        loss_type="dapo", scale_rewards="group", importance_sampling_level="token",
        mask_truncated_completions=False, reward_weights=None, top_entropy_quantile=1.0,
        use_bias_correction_kl=True,
        sync_ref_model=False, ref_model_mixup_alpha=0.6, ref_model_sync_steps=512,
        log_completions=False, num_completions_to_print=None, learning_rate=1e-6, logging_steps=10,
    )  # fmt: skip
    assert {k: getattr(config, k) for k in expected} == expected


@pytest.mark.parametrize(
    "given, expected", [(True, "group"), (False, "none"), ("batch", "batch"), ("false", "none")]
)
def test_scale_rewards_accepts_trls_booleans(given, expected):
    assert _config(scale_rewards=given).scale_rewards == expected


def test_generation_sizes_are_derived_once():
    # 8 per device, 2 accumulation steps: one generation feeds one update (16 completions, 2 groups of 8)
    config = _config(gradient_accumulation_steps=2)
    assert (config.steps_per_generation, config.generation_batch_size, config.updates_per_generation) == (
        2,
        16,
        1,
    )
    assert config.local_prompts_per_generation == 2
    # generation_batch_size=32 with 8 per step: 4 micro-batches, i.e. 2 updates of 2 micro-batches each
    config = _config(gradient_accumulation_steps=2, generation_batch_size=32)
    assert (
        config.steps_per_generation,
        config.updates_per_generation,
        config.local_prompts_per_generation,
    ) == (4, 2, 4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_generations": 1}, "num_generations must be >= 2"),
        ({"loss_type": "ppo"}, "loss_type must be one of"),
        ({"scale_rewards": "global"}, "scale_rewards must be one of"),
        ({"importance_sampling_level": "batch"}, "importance_sampling_level must be one of"),
        ({"top_p": 0.0}, "top_p must be in"),
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"delta": 1.0}, "delta must be > 1"),
        ({"beta": -0.1}, "beta must be >= 0"),
        ({"top_entropy_quantile": 1.5}, "top_entropy_quantile must be in"),
        ({"max_completion_length": 0}, "max_completion_length must be a positive integer"),
        ({"sync_ref_model": True}, "sync_ref_model needs beta > 0"),
        ({"steps_per_generation": 2, "generation_batch_size": 16}, "not both"),
        ({"num_generations": 3}, "multiple of num_generations"),
        (
            {"gradient_accumulation_steps": 2, "steps_per_generation": 3},
            "multiple of gradient_accumulation_steps",
        ),
        ({"generation_batch_size": 12}, "generation_batch_size by per_device_train_batch_size"),
        ({"reward_weights": []}, "reward_weights must be a non-empty list"),
        ({"max_sampling_rounds": 0}, "max_sampling_rounds must be a positive integer"),
    ],
)
def test_bad_values_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _config(**kwargs)


def test_sequence_ratios_with_a_token_summed_loss_warn_as_trl_does():
    with pytest.warns(UserWarning, match="loss_type='dapo'.*for GSPO as published use loss_type='grpo'"):
        _config(importance_sampling_level="sequence", loss_type="dapo")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _config(importance_sampling_level="sequence", loss_type="grpo")
