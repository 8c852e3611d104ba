"""DeepSeek-V3.2's off-policy sequence mask by hand, and its effect inside policy_loss."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.core import policy_loss
from rlhfkit.core.off_policy import off_policy_sequence_mask


def test_negative_advantage_sequences_that_drifted_too_far_are_dropped():
    logprobs = torch.tensor([[-1.0, -1.0, -9.0], [-1.0, -1.0, -9.0], [-2.0, -2.0, 0.0], [-2.0, -2.0, 0.0]])
    sampling = torch.tensor([[-0.5, -0.5, 0.0], [-0.5, -0.5, 0.0], [-2.0, -1.0, 0.0], [-2.0, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 0], [1, 1, 0]])
    advantages = torch.tensor([-1.0, 1.0, -1.0, 0.0])
    # drift = mean over loss tokens of sampling - current: rows 0-1 0.5 (padded -9 ignored), rows 2-3 0.5
    keep = off_policy_sequence_mask(advantages, logprobs, sampling, mask, threshold=0.4)
    assert keep.tolist() == [False, True, False, True]  # A >= 0 always kept
    keep = off_policy_sequence_mask(advantages, logprobs, sampling, mask, threshold=0.5)
    assert keep.tolist() == [True, True, True, True]  # drift <= threshold kept


def test_a_drift_toward_the_current_policy_and_nan_sampling_logprobs_count_as_none():
    logprobs = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    sampling = torch.tensor([[-3.0, -3.0], [math.nan, -0.9]])  # row 0: now more likely (drift -2)
    keep = off_policy_sequence_mask(torch.tensor([-1.0, -1.0]), logprobs, sampling, torch.ones(2, 2), 0.01)
    assert keep.tolist() == [True, False]  # row 1: NaN -> 0, (0 + 0.1) / 2 = 0.05 > 0.01


def test_policy_loss_drops_masked_sequences_from_the_policy_term_only():
    logprobs = torch.zeros(2, 2, requires_grad=True)
    kl = torch.full((2, 2), 0.5)
    out = policy_loss("dapo", logprobs, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.ones(2, 2),
                      per_token_kl=kl, beta=0.1, sequence_mask=torch.tensor([True, False]))  # fmt: skip
    # ratio 1: policy terms -1 per token of row 0, row 1 dropped; KL 0.1 * 0.5 on all 4; / 4 tokens
    assert out.loss.item() == pytest.approx((-2 + 4 * 0.05) / 4)
    out.loss.backward()
    assert logprobs.grad[1].abs().sum() == 0 and logprobs.grad[0].abs().sum() > 0


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="sequence_mask must be"):
        policy_loss("grpo", torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2), torch.ones(2, 2),
                    sequence_mask=torch.ones(2, 2).bool())  # fmt: skip
    with pytest.raises(ValueError, match="same \\(N, T\\) shape"):
        off_policy_sequence_mask(torch.zeros(2), torch.zeros(2, 2), torch.zeros(2, 3), torch.ones(2, 2), 0.5)
