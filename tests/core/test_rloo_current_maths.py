"""The maths of RLOO's current (TRL 1.x) form, against numbers worked out by hand: the nan-aware
leave-one-out baseline, batch standardisation, and the asymmetric sequence-level clip."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from rlhfkit.core import leave_one_out_advantages, ppo_policy_loss

NAN = float("nan")


def test_leave_one_out_baseline_by_hand_skips_unscored_rows():
    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0, NAN, 4.0, 4.0, 5.0])
    # group 1: 1 - (2+3+6)/3, 2 - (1+3+6)/3, 3 - (1+2+6)/3, 6 - (1+2+3)/3
    # group 2: the NaN row is left out of its siblings' baselines and gets 0; 4 - (4+5)/2, 5 - (4+4)/2
    expected = torch.tensor([-8 / 3, -4 / 3, 0.0, 4.0, 0.0, -0.5, -0.5, 1.0])
    torch.testing.assert_close(leave_one_out_advantages(rewards, 4), expected)


def test_normalised_advantages_use_only_defined_rows():
    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0, NAN, 4.0, 4.0, 5.0])
    raw = [-8 / 3, -4 / 3, 0.0, 4.0, -0.5, -0.5, 1.0]  # the NaN row's advantage is undefined
    mean, std = statistics.mean(raw), statistics.stdev(raw)  # unbiased, as TRL's nanstd
    expected = [(a - mean) / (std + 1e-4) for a in raw]
    expected.insert(4, 0.0)
    got = leave_one_out_advantages(rewards, 4, normalize=True)
    torch.testing.assert_close(got, torch.tensor(expected), rtol=1e-5, atol=1e-6)


def test_a_group_with_one_scored_row_has_no_signal():
    rewards = torch.tensor([NAN, 2.0, 1.0, 3.0])
    assert leave_one_out_advantages(rewards, 2).tolist() == [0.0, 0.0, -2.0, 2.0]  # 1 - 3, 3 - 1
    # the two defined rows standardised: mean 0, unbiased std of (-2, 2) = 2 * sqrt(2)
    got = leave_one_out_advantages(rewards, 2, normalize=True)
    assert got[:2].tolist() == [0.0, 0.0]
    assert got[2].item() == pytest.approx(-2 / (2 * math.sqrt(2) + 1e-4))


def test_asymmetric_clip_of_the_sequence_ratio():
    new, old = torch.tensor([math.log(1.5), math.log(0.5)]), torch.zeros(2)
    advantages = torch.tensor([1.0, -1.0])
    # row 1: ratio 1.5, A > 0: -min(1.5, 1 + 0.28) = -1.28
    # row 2: ratio 0.5, A < 0: -min(-0.5, -(1 - 0.2)) = 0.8
    out = ppo_policy_loss(new, old, advantages, None, 0.2, cliprange_high=0.28)
    assert out.loss.item() == pytest.approx((-1.28 + 0.8) / 2)
    symmetric = ppo_policy_loss(new, old, advantages, None, 0.2)
    assert symmetric.loss.item() == pytest.approx((-1.2 + 0.8) / 2)
    assert out.clipfrac.item() == 1.0
