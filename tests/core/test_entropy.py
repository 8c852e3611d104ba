"""The entropy bonus term and Skywork-OR1's adaptive coefficient, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.core.entropy import adapt_entropy_coef, applied_entropy_coef, entropy_bonus


def test_entropy_bonus_is_minus_coef_times_the_masked_mean_and_carries_its_gradient():
    entropies = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]]).bool()
    term = entropy_bonus(entropies, mask, coef=0.5)
    # mean over the three real tokens: (1 + 2 + 3) / 3 = 2; -0.5 * 2 = -1
    assert term.item() == pytest.approx(-1.0)
    term.backward()
    # d/dH_t of -0.5 * mean = -0.5 / 3 on each real token, 0 elsewhere
    expected = torch.tensor([[-1 / 6, -1 / 6, 0.0], [-1 / 6, 0.0, 0.0]])
    torch.testing.assert_close(entropies.grad, expected)


def test_an_empty_mask_gives_zero_not_nan():
    entropies = torch.ones(2, 3, requires_grad=True)
    assert entropy_bonus(entropies, torch.zeros(2, 3).bool(), 0.5).item() == 0.0


@pytest.mark.parametrize(
    "entropy, expected",
    [
        (0.1, 0.015),  # at or below the target 0.2: up by delta 0.005
        (0.2, 0.015),  # equal counts as below
        (0.3, 0.005),  # above: down by delta
        (float("nan"), 0.01),  # nothing measured: unchanged
    ],
)
def test_adapt_moves_the_coefficient_toward_the_target(entropy, expected):
    assert adapt_entropy_coef(0.01, entropy, 0.2, 0.005, 0.0, 1.0) == pytest.approx(expected)


def test_adapt_stays_within_its_bounds():
    assert adapt_entropy_coef(0.999, 0.0, 0.2, 0.005, 0.0, 1.0) == 1.0  # 1.004 capped at max
    assert adapt_entropy_coef(0.002, 5.0, 0.2, 0.005, 0.0, 1.0) == 0.0  # -0.003 floored at min


def test_the_applied_coefficient_waits_for_a_low_enough_entropy():
    assert applied_entropy_coef(0.3, math.inf, 0.2, adaptive=False) == 0.3  # fixed: always applied
    assert applied_entropy_coef(0.3, math.inf, 0.2, adaptive=True) == 0.0  # nothing measured yet
    assert applied_entropy_coef(0.3, 0.5, 0.2, adaptive=True) == 0.0  # above the target
    assert applied_entropy_coef(0.3, 0.2, 0.2, adaptive=True) == 0.3
