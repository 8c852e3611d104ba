"""`rlhfkit.dft_loss`: TRL 1.x's public DFT loss helper, the one SFTConfig(loss_type='dft') trains with."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

import rlhfkit
from rlhfkit.trainers.sft.token_stats import dft_token_losses


def test_two_equally_likely_tokens_give_half_the_cross_entropy():
    # vocabulary of 2, equal logits: every scored token has p = 1/2, so each term is 1/2 * log 2
    logits = torch.zeros(2, 3, 2)
    labels = torch.tensor([[1, 0, 0], [0, 1, -100]])  # shifted: [0, 0] and [1, -100]: 3 scored tokens
    loss = rlhfkit.dft_loss(SimpleNamespace(logits=logits), labels)
    assert math.isclose(loss.item(), 0.5 * math.log(2), rel_tol=1e-6)
    # num_items_in_batch (the tokens of the whole accumulated batch) divides the sum instead
    assert math.isclose(
        rlhfkit.dft_loss(SimpleNamespace(logits=logits), labels, 6).item(), 0.25 * math.log(2), rel_tol=1e-6
    )


def test_matches_a_naive_loop_and_its_gradient_is_p_times_cross_entropys():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 5, requires_grad=True)
    labels = torch.tensor([[3, 1, -100, 2], [0, 4, 4, -100]])
    loss = rlhfkit.dft_loss(SimpleNamespace(logits=logits), labels)
    terms = []
    for b in range(2):
        for t in range(3):  # position t scores labels[t + 1]
            if labels[b, t + 1] != -100:
                logp = torch.log_softmax(logits[b, t], -1)[labels[b, t + 1]]
                terms.append(-logp.exp().item() * logp.item())
    assert math.isclose(loss.item(), sum(terms) / len(terms), rel_tol=1e-5)
    # d/dlogp of -stopgrad(p) * logp is -p
    logp = torch.tensor([-0.5, -2.0], requires_grad=True)
    dft_token_losses(logp).sum().backward()
    torch.testing.assert_close(logp.grad, -logp.detach().exp())
