"""PPOConfig: seed defaults, derived batch sizes, deprecated aliases and clear errors."""

from __future__ import annotations

import pytest

from rlhfkit import PPOConfig


def test_defaults_match_the_seed_documentation():
    config = PPOConfig()
    expected = dict(
        steps=20000,
        learning_rate=1e-5,
        adap_kl_ctrl=True,
        init_kl_coef=0.2,
        kl_penalty="kl",
        target=6,
        horizon=10000,
        gamma=1,
        lam=0.95,
        cliprange=0.2,
        cliprange_value=0.2,
        vf_coef=0.1,
        batch_size=256,
        forward_batch_size=None,
        mini_batch_size=1,
        gradient_accumulation_steps=1,
        ppo_epochs=4,
        max_grad_norm=None,
        seed=0,
        optimize_device_cache=False,
        early_stopping=False,
        target_kl=1,
        compare_steps=1,
        ratio_threshold=10.0,
        use_score_scaling=False,
        use_score_norm=False,
        score_clip=None,
        whiten_rewards=False,
        log_with=None,
        tracker_project_name="trl",
        remove_unused_columns=True,
        task_name=None,
        model_name=None,
        query_dataset=None,
        reward_model=None,
    )
    for name, value in expected.items():
        assert getattr(config, name) == value, name
    assert config.tracker_kwargs == {} and config.accelerator_kwargs == {} and config.project_kwargs == {}
    assert isinstance(config.exp_name, str) and config.exp_name


def test_derived_batch_sizes():
    config = PPOConfig(batch_size=24, mini_batch_size=4, gradient_accumulation_steps=3)
    assert config.backward_batch_size == 12
    assert config.world_size == 1
    assert config.global_backward_batch_size == 12 and config.global_batch_size == 24
    config._derive_sizes(world_size=2)  # what the trainer does with 2 processes
    assert config.global_backward_batch_size == 24 and config.global_batch_size == 48


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(batch_size=10, mini_batch_size=4), "divisible"),
        (dict(batch_size=8, mini_batch_size=2, gradient_accumulation_steps=3), "gradient_accumulation_steps"),
        (dict(kl_penalty="kld"), "kl_penalty"),
        (dict(batch_size=0), "batch_size"),
        (dict(ppo_epochs=0), "ppo_epochs"),
        (dict(cliprange=0.0), "cliprange"),
        (dict(gamma=1.5), "gamma"),
        (dict(score_clip=-1.0), "score_clip"),
        (dict(max_grad_norm=0.0), "max_grad_norm"),
        (dict(accelerator_kwargs={"gradient_accumulation_steps": 2}), "gradient_accumulation_steps"),
    ],
)
def test_invalid_settings_raise_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PPOConfig(**kwargs)


def test_score_norm_without_score_scaling_is_ignored_with_a_note(caplog):
    # TRL applies use_score_norm only inside use_score_scaling; alone it is accepted and has no effect
    with caplog.at_level("INFO", logger="rlhfkit.trainers.ppo.config"):
        config = PPOConfig(use_score_norm=True)
    assert config.use_score_norm and not config.use_score_scaling
    assert any("use_score_norm has no effect" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("kind", ["kl", "abs", "mse", "full", "k3"])
def test_every_kl_penalty_is_accepted(kind):
    assert PPOConfig(kl_penalty=kind).kl_penalty == kind


def test_deprecated_aliases_still_work():
    with pytest.warns(FutureWarning, match="mini_batch_size"):
        config = PPOConfig(batch_size=8, forward_batch_size=4)
    assert config.mini_batch_size == 4
    with pytest.warns(FutureWarning, match="optimize_device_cache"):
        config = PPOConfig(optimize_cuda_cache=True)
    assert config.optimize_device_cache is True


def test_dict_fields_accept_json_strings_from_the_command_line():
    config = PPOConfig(tracker_kwargs='{"wandb": {"name": "run1"}}', project_kwargs="")
    assert config.tracker_kwargs == {"wandb": {"name": "run1"}}
    assert config.project_kwargs == {}
    assert PPOConfig().to_dict()["batch_size"] == 256
