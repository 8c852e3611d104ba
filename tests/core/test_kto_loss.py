"""KTO's reference point, losses and weight ranges against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.core.kto import (
    KTO_LOSSES,
    balanced_weight_ranges,
    kto_loss,
    kto_reference_point,
)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_reference_point_is_the_clamped_detached_mean_log_ratio():
    policy = torch.tensor([-1.0, -3.0, -2.0], requires_grad=True)
    reference = torch.tensor([-2.0, -2.0, -2.5])
    # log-ratios 1, -1, 0.5: mean 0.5 / 3 = 1/6
    z = kto_reference_point(policy, reference)
    assert z.item() == pytest.approx(1 / 6)
    assert not z.requires_grad
    # log-ratios -1, -1, -1: mean -1, clamped to 0
    assert kto_reference_point(torch.tensor([-3.0] * 3), torch.tensor([-2.0] * 3)).item() == 0.0


def test_reference_point_averages_the_gathered_process_means():
    # this process's mean is 1; the other process (simulated by gather) had 3: z = 2
    z = kto_reference_point(
        torch.tensor([0.0, 0.0]), torch.tensor([-1.0, -1.0]), gather=lambda t: torch.cat([t, t + 2])
    )
    assert z.item() == pytest.approx(2.0)


def test_kto_loss_by_hand():
    policy = torch.tensor([-1.0, -4.0])
    reference = torch.tensor([-2.0, -3.0])
    labels = torch.tensor([True, False])
    # r = (1, -1), z = 0.5, beta = 0.5
    losses, rewards = kto_loss(
        policy, reference, labels, torch.tensor(0.5), beta=0.5, desirable_weight=2.0, undesirable_weight=3.0
    )
    # desirable: 2 * (1 - sigmoid(0.5 * (1 - 0.5))) = 2 * (1 - sigmoid(0.25))
    # undesirable: 3 * (1 - sigmoid(0.5 * (0.5 - (-1)))) = 3 * (1 - sigmoid(0.75))
    assert losses.tolist() == pytest.approx([2 * (1 - sigmoid(0.25)), 3 * (1 - sigmoid(0.75))])
    assert rewards.tolist() == pytest.approx([0.5, -0.5])  # beta * r


def test_apo_zero_unpaired_ignores_the_reference_point():
    policy, reference = torch.tensor([-1.0, -1.0]), torch.tensor([-2.0, -2.0])  # r = 1 on both rows
    labels = torch.tensor([True, False])
    losses, _ = kto_loss(policy, reference, labels, 5.0, beta=0.1, loss_type="apo_zero_unpaired")
    # desirable: 1 - sigmoid(0.1); undesirable: sigmoid(0.1), whatever z is
    assert losses.tolist() == pytest.approx([1 - sigmoid(0.1), sigmoid(0.1)])
    # and it equals the KTO loss at z = 0
    assert torch.allclose(losses, kto_loss(policy, reference, labels, 0.0, beta=0.1)[0])


def test_gradient_raises_desirable_and_lowers_undesirable_logps():
    policy = torch.tensor([-1.0, -1.0], requires_grad=True)
    losses, _ = kto_loss(policy, torch.tensor([-1.0, -1.0]), torch.tensor([True, False]), 0.2, beta=0.1)
    losses.mean().backward()
    assert policy.grad[0] < 0 < policy.grad[1]  # descent raises the desirable, lowers the undesirable


def test_unknown_loss_type_names_the_choices():
    with pytest.raises(ValueError, match=r"loss_type must be one of \['apo_zero_unpaired', 'kto'\]"):
        kto_loss(torch.zeros(1), torch.zeros(1), torch.ones(1, dtype=torch.bool), loss_type="sigmoid")
    assert set(KTO_LOSSES) == {"kto", "apo_zero_unpaired"}


def test_balanced_weight_ranges_eq_8():
    # 10 desirable, 30 undesirable, both weights 1: desirable_weight in [3, 4], undesirable in [0.25, 0.33]
    desirable, undesirable = balanced_weight_ranges(10, 30, 1.0, 1.0)
    assert desirable == (3.0, 4.0)
    assert undesirable == (0.25, 0.33)
    # no undesirable rows: counted as 1
    assert balanced_weight_ranges(4, 0, 1.0, 1.0)[0] == (0.25, 0.33)
