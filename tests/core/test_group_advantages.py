"""group_advantages: each estimator and reward scale against hand-derived numbers."""

import math

import pytest
import torch

from rlhfkit.core import ADVANTAGE_ESTIMATORS, group_advantages, rloo_advantages

# two groups of G=4: a mixed group and a group whose rewards are all equal
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])


def test_group_mean_without_scaling():
    # group 0 mean 0.5 -> +-0.5; group 1 mean 2 -> 0
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(group_advantages(REWARDS, 4, "group_mean", "none"), expected)


def test_group_scaling_uses_the_unbiased_std_plus_1e_4():
    # group 0: squared deviations 4 * 0.25 = 1, unbiased var 1/3 (biased would give std 0.5 -> 1.0);
    # group 1 has std 0, so its zero advantages stay 0
    adv = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    expected = torch.tensor([adv, -adv, -adv, adv, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(group_advantages(REWARDS, 4), expected)


def test_batch_scaling_divides_by_the_std_of_all_rewards():
    # batch mean 1.25; squared deviations 2*0.0625 + 2*1.5625 + 4*0.5625 = 5.5; unbiased var 5.5/7
    adv = 0.5 / (math.sqrt(5.5 / 7) + 1e-4)
    expected = torch.tensor([adv, -adv, -adv, adv, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(group_advantages(REWARDS, 4, scale_rewards="batch"), expected)


def test_rloo_subtracts_the_mean_of_the_other_completions():
    # reward 1: others (0, 0, 1) mean 1/3 -> 2/3; reward 0: others (1, 0, 1) mean 2/3 -> -2/3
    expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(group_advantages(REWARDS, 4, "rloo", "none"), expected)


def test_rloo_advantages_is_the_unscaled_rloo_estimator():
    rewards = torch.randn(12, generator=torch.Generator().manual_seed(0))  # 3 prompts x 4 completions
    torch.testing.assert_close(rloo_advantages(rewards, 4), group_advantages(rewards, 4, "rloo", "none"))


def test_vectorised_group_mean_std_matches_a_loop():
    rewards = torch.randn(12, generator=torch.Generator().manual_seed(1))
    expected = []
    for g in range(4):
        group = rewards[g * 3 : g * 3 + 3].tolist()
        mean = sum(group) / 3
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / 2)
        expected += [(r - mean) / (std + 1e-4) for r in group]
    torch.testing.assert_close(group_advantages(rewards, 3), torch.tensor(expected))


def test_nan_rewards_are_left_out_and_get_zero_advantage():
    # group 0 = (1, nan, 3): mean of the two scored is 2 -> (-1, 0, +1); std of (1, 3) = sqrt(2)
    rewards = torch.tensor([1.0, float("nan"), 3.0, 0.0, 1.0, 2.0])
    adv = group_advantages(rewards, 3, "group_mean", "none")
    torch.testing.assert_close(adv, torch.tensor([-1.0, 0.0, 1.0, -1.0, 0.0, 1.0]))
    scaled = group_advantages(rewards, 3)
    torch.testing.assert_close(scaled[:3], torch.tensor([-1.0, 0.0, 1.0]) / (math.sqrt(2) + 1e-4))
    # rloo: reward 1's only scored neighbour is 3 -> -2
    torch.testing.assert_close(
        group_advantages(rewards, 3, "rloo", "none")[:3], torch.tensor([-2.0, 0.0, 2.0])
    )


def test_output_is_detached_and_a_single_completion_group_has_zero_advantage():
    rewards = torch.tensor([1.0, 2.0], requires_grad=True)
    assert not group_advantages(rewards, 2).requires_grad
    torch.testing.assert_close(group_advantages(rewards, 1, scale_rewards="none"), torch.zeros(2))


def test_registry_lists_the_estimators():
    assert set(ADVANTAGE_ESTIMATORS) == {"group_mean", "rloo"}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"estimator": "ppo"}, "estimator"),
        ({"scale_rewards": "global"}, "scale_rewards"),
        ({"group_size": 3}, "group_size=3"),
        ({"group_size": 1}, "group_size must be >= 2"),
        ({"group_size": 1, "estimator": "rloo", "scale_rewards": "none"}, "group_size must be >= 2"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    kwargs = {"group_size": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        group_advantages(REWARDS, **kwargs)


def test_rewards_must_be_one_dimensional():
    with pytest.raises(ValueError, match="rewards must be 1-D"):
        group_advantages(REWARDS.reshape(2, 4), 4)
