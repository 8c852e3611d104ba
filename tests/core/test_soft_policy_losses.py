"""SAPO, VESPO and LUSPO, by hand on the fixture of test_policy_losses (old_logprobs = 0, so logprob = log r):
sequence 0: ratios (1.0, 1.5, 0.5), advantage +1; sequence 1: ratios (1.1, 0.7) and a padded 2.0,
advantage -2."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.core import policy_loss

RATIOS = torch.tensor([[1.0, 1.5, 0.5], [1.1, 0.7, 2.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
ADVANTAGES = torch.tensor([1.0, -2.0], dtype=torch.float64)


def run(loss_type, ratios=RATIOS, **kwargs):
    logprobs = ratios.log().clone().requires_grad_(True)
    out = policy_loss(loss_type, logprobs, torch.zeros_like(logprobs), ADVANTAGES, MASK, **kwargs)
    out.loss.backward()
    return out, logprobs.grad


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_sapo_is_a_soft_gate_normalised_per_sequence():
    out, grad = run("sapo")  # TRL's defaults: temperature 1.0 for A > 0, 1.05 for A <= 0
    # term -4 sigmoid(tau (r - 1)) / tau * A; sequence 0 (tau 1): 4 (0.5 + s(0.5) + s(-0.5)) = 6, mean -2
    seq0 = -6.0 / 3
    gate1 = [4 * sigmoid(1.05 * (r - 1)) / 1.05 for r in (1.1, 0.7)]
    seq1 = 2.0 * sum(gate1) / 2  # -gate * (-2), mean over its two tokens
    assert out.loss.item() == pytest.approx((seq0 + seq1) / 2)
    # d term / d logprob = -4 s (1 - s) r A (the tau cancels); / (tokens * sequences)
    expected = [
        [-4 * sigmoid(r - 1) * (1 - sigmoid(r - 1)) * r / 6 for r in (1.0, 1.5, 0.5)],
        [*[8 * sigmoid(1.05 * (r - 1)) * (1 - sigmoid(1.05 * (r - 1))) * r / 4 for r in (1.1, 0.7)], 0.0],
    ]
    torch.testing.assert_close(grad, torch.tensor(expected, dtype=torch.float64))
    assert grad[0, 0].item() == pytest.approx(-1 / 6)  # at r = 1 the gate passes the plain gradient
    assert out.clip_ratio_region.item() == 0.0  # nothing is clipped


def test_sapo_temperatures_are_its_options():
    out, _ = run("sapo", loss_options={"sapo_temperature_pos": 2.0, "sapo_temperature_neg": 2.0})
    # sequence 0: -(4/2) (0.5 + s(1) + s(-1)) / 3 = -1; sequence 1: 2 * (4/2)(s(0.2) + s(-0.6)) / 2
    seq1 = 2.0 * (sigmoid(0.2) + sigmoid(-0.6))
    assert out.loss.item() == pytest.approx((-1.0 + seq1) / 2)


def test_vespo_scales_each_logprob_by_its_sequences_gamma_weight():
    out, grad = run("vespo")  # TRL's defaults: k 2, lambda 3 for A >= 0; k 3, lambda 2 for A < 0
    w0, w1 = 1.0 * 1.5 * 0.5, 1.1 * 0.7  # sequence ratios: products over the loss tokens (padding left out)
    phi0 = math.exp(3 + 2 * math.log(w0) - 3 * w0)
    phi1 = math.exp(2 + 3 * math.log(w1) - 2 * w1)
    # -phi A logprob summed over the 5 loss tokens / 5 (dapo's normaliser)
    assert out.loss.item() == pytest.approx((-phi0 * math.log(w0) + 2 * phi1 * math.log(w1)) / 5)
    # phi is detached: d / d logprob = -phi A / 5
    expected = torch.tensor([[-phi0 / 5] * 3, [2 * phi1 / 5, 2 * phi1 / 5, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected)


def test_vespo_weight_is_one_on_policy_and_options_change_it():
    _, grad = run("vespo", ratios=torch.ones(2, 3, dtype=torch.float64))
    # w = 1: phi = exp(lambda - lambda) = 1 whatever k and lambda; -A / 5 on every loss token
    expected = torch.tensor([[-0.2, -0.2, -0.2], [0.4, 0.4, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected)
    _, grad = run("vespo", loss_options={"vespo_k_pos": 1.0, "vespo_lambda_pos": 1.0})
    phi0 = math.exp(1 + math.log(0.75) - 0.75)
    assert grad[0, 0].item() == pytest.approx(-phi0 / 5)


def test_luspo_weights_each_sequence_by_its_length():
    out, _ = run("luspo", importance_sampling_level="sequence")
    s0, s1 = 0.75 ** (1 / 3), 0.77 ** (1 / 2)  # GSPO's length-normalised ratios, both unclipped
    # -min(s A, clip(s) A) times the sequence's length, summed, / 2 sequences
    assert out.loss.item() == pytest.approx((-s0 * 3 + 2 * s1 * 2) / 2)
    gspo, _ = run("gspo")
    assert gspo.loss.item() == pytest.approx((-s0 + 2 * s1) / 2)  # the same terms, unweighted


def test_luspo_at_token_level_sums_each_sequences_clipped_terms():
    out, _ = run("luspo")
    # per-token clipped terms (see test_policy_losses): sums -2.7 and +3.8, / 2 sequences
    assert out.loss.item() == pytest.approx((-2.7 + 3.8) / 2)


def test_unknown_loss_options_are_named():
    with pytest.raises(ValueError, match="loss_type='grpo' has no option vespo_k_pos; its options: none"):
        run("grpo", loss_options={"vespo_k_pos": 1.0})
    with pytest.raises(ValueError, match="'sapo' has no option sapo_temp; its options: sapo_temperature_pos"):
        run("sapo", loss_options={"sapo_temp": 1.0})
