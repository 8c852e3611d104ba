"""LD-DPO's length-desensitised log-probs and WPO's pair weights, on hand-made numbers."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.core.preference_weights import (
    length_desensitised_logps,
    log_sum_squared_probs,
    wpo_pair_weights,
)

# one pair: chosen has 3 response tokens, rejected 2; a prompt position (mask 0) leads each row
TOKEN_LOGPS = torch.tensor(
    [
        [0.0, -1.0, -2.0, -3.0],  # chosen
        [0.0, -0.5, -0.25, 0.0],  # rejected (last position is padding)
    ]
)
MASK = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]], dtype=torch.bool)


def test_ld_splits_at_the_shorter_length():
    # shared length = min(3, 2) = 2: chosen = (-1 - 2) + alpha * (-3); rejected has no tail: -0.75
    got = length_desensitised_logps(TOKEN_LOGPS, MASK, alpha=0.5)
    torch.testing.assert_close(got, torch.tensor([-3.0 + 0.5 * -3.0, -0.75]))


def test_ld_alpha_one_is_the_plain_sum_and_zero_cuts_the_tail():
    sums = (TOKEN_LOGPS * MASK).sum(1)
    torch.testing.assert_close(length_desensitised_logps(TOKEN_LOGPS, MASK, 1.0), sums)
    torch.testing.assert_close(length_desensitised_logps(TOKEN_LOGPS, MASK, 0.0), torch.tensor([-3.0, -0.75]))


def test_ld_pairs_rows_by_halves_and_matches_a_loop():
    torch.manual_seed(0)
    logps = -torch.rand(6, 7)
    mask = torch.rand(6, 7) > 0.3
    got = length_desensitised_logps(logps, mask, 0.3)
    for i in range(6):
        j = (i + 3) % 6  # the other side of the same pair
        shared = min(int(mask[i].sum()), int(mask[j].sum()))
        seen, want = 0, 0.0
        for t in range(7):
            if mask[i, t]:
                seen += 1
                want += logps[i, t].item() * (1.0 if seen <= shared else 0.3)
        assert got[i].item() == pytest.approx(want, abs=1e-6)


def test_ld_rejects_an_odd_number_of_rows():
    with pytest.raises(ValueError, match=r"\(2B, T\)"):
        length_desensitised_logps(torch.zeros(3, 2), torch.ones(3, 2, dtype=torch.bool), 0.5)


def test_log_sum_squared_probs_by_hand():
    # logits (log 3, 0): p = (0.75, 0.25), sum p^2 = 0.625
    logits = torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]])
    torch.testing.assert_close(log_sum_squared_probs(logits), torch.tensor([math.log(0.625), math.log(0.5)]))


def test_wpo_weight_is_the_product_of_geometric_mean_ratios():
    # p = (0.75, 0.25) at every position, sum p^2 = 0.625
    log_sq = torch.full((2, 3), math.log(0.625))
    # chosen samples token 0 twice: each ratio 0.75 / 0.625 = 1.2, geometric mean 1.2
    # rejected samples token 1 once: 0.25 / 0.625 = 0.4; the masked positions do not count
    logps = torch.tensor([[math.log(0.75), math.log(0.75), 5.0], [math.log(0.25), 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    weights = wpo_pair_weights(logps.requires_grad_(), log_sq, mask)
    torch.testing.assert_close(weights, torch.tensor([1.2 * 0.4]))
    assert not weights.requires_grad  # a weight, not a path for gradients
