"""RLOOConfig: seed 000 names and defaults, derived batch sizes, and errors that name the arguments."""

from __future__ import annotations

import dataclasses

import pytest

from rlhfkit.trainers.rloo.config import RLOOConfig


def _config(**kwargs) -> RLOOConfig:
    kwargs.setdefault("output_dir", "unused")
    return RLOOConfig(report_to="none", use_cpu=True, **kwargs)


def test_seed_fields_and_defaults():
    defaults = {f.name: f.default for f in dataclasses.fields(RLOOConfig)}
    expected = {
        "exp_name": "rloo_config",
        "reward_model_path": "EleutherAI/pythia-160m",
        "sft_model_path": "EleutherAI/pythia-160m",
        "num_ppo_epochs": 4,
        "whiten_rewards": False,
        "kl_coef": 0.05,
        "cliprange": 0.2,
        "rloo_k": 2,
        "normalize_reward": False,
        "reward_clip_range": None,  # 10 in the classic form (`classic_clip_range`)
        "normalize_advantage": False,
        "token_level_kl": False,
        "ds3_gather_for_generation": True,
        "num_mini_batches": 1,
        "total_episodes": None,
        "local_rollout_forward_batch_size": 64,
        "num_sample_generations": 10,
        "response_length": 53,
        "stop_token": None,
        "stop_token_id": None,
        "temperature": None,  # 0.7 in the classic form, 1.0 in the current one (`settle`)
        "missing_eos_penalty": None,
        "dataset_num_proc": None,
        "world_size": None,
        "num_total_batches": None,
        "micro_batch_size": None,
        "local_batch_size": None,
        "batch_size": None,
        "local_mini_batch_size": None,
        "mini_batch_size": None,
    }
    for name, value in expected.items():
        assert defaults[name] == value, name


def test_derived_sizes_by_hand():
    config = _config(
        per_device_train_batch_size=4,
        gradient_accumulation_steps=3,
        num_mini_batches=2,
        rloo_k=4,
        total_episodes=100,
    )
    # one process: local = 4 * 3 * 2 = 24 completions per update = 6 prompts x 4 samples
    assert config.world_size == 1
    assert config.local_batch_size == 24 and config.batch_size == 24
    assert config.micro_batch_size == 4
    assert config.mini_batch_size == 12 and config.local_mini_batch_size == 12
    assert config.local_prompt_batch_size == 6
    # ceil(100 / 24) = 5 updates
    assert config.num_total_batches == 5
    # total_episodes unset: num_train_epochs * dataset size = 2 * 30 = 60 -> ceil(60 / 24) = 3
    config = _config(
        per_device_train_batch_size=4,
        gradient_accumulation_steps=3,
        num_mini_batches=2,
        rloo_k=4,
        num_train_epochs=2,
    )
    assert config.num_total_batches is None
    config.compute_batch_sizes(train_dataset_size=30)
    assert config.total_episodes == 60 and config.num_total_batches == 3


def test_sample_generation_frequency():
    config = _config(per_device_train_batch_size=2, total_episodes=40, num_sample_generations=4)
    assert config.num_total_batches == 20 and config.sample_generations_freq == 5
    assert (
        _config(
            per_device_train_batch_size=2, total_episodes=4, num_sample_generations=0
        ).sample_generations_freq
        == 0
    )


def test_rloo_k_must_divide_the_local_batch():
    with pytest.raises(ValueError, match="rloo_k"):
        _config(per_device_train_batch_size=3, rloo_k=2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rloo_k": 1}, "rloo_k"),
        ({"cliprange": 0.0}, "cliprange"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"num_ppo_epochs": 0}, "num_ppo_epochs"),
        ({"stop_token": "eot"}, "stop_token"),
        ({"reward_weights": [1.0, float("nan")]}, "reward_weights"),
        ({"temperature": 0.0}, "temperature"),
    ],
)
def test_bad_values_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _config(**kwargs)
