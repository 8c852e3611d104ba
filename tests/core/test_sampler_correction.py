"""core.sampler_correction: the importance weights pi_old / pi_sampler of every mode, by hand, and their use
in core.policy_losses.policy_loss."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.core.policy_losses import policy_loss
from rlhfkit.core.sampler_correction import (
    SAMPLER_CORRECTION_MODES,
    importance_weight_stats,
    sampler_importance_weights,
    sampler_log_ratios,
)

# Two rows with log(pi_old / pi_sampler) chosen so the ratios are round numbers:
#   row 0: 2, 0.5, 4 on its three loss tokens; its padding column holds garbage (old 100, sampler NaN)
#   row 1: 0.25, 1.5 on two loss tokens, then padding
LN = math.log
OLD = torch.tensor([[LN(2), LN(0.5), LN(4), 100.0], [LN(0.25), LN(1.5), 7.0, -3.0]])
SAMPLER = torch.tensor([[0.0, 0.0, 0.0, float("nan")], [0.0, 0.0, -5.0, 2.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)


def weights(mode, clip_min=None, clip_max=3.0):
    return sampler_importance_weights(OLD, SAMPLER, MASK, mode, clip_min, clip_max)


def test_token_log_ratios_are_zero_off_the_mask_and_sequence_ones_sum_the_row():
    token = sampler_log_ratios(OLD, SAMPLER, MASK, "token")
    assert torch.allclose(token.exp(), torch.tensor([[2.0, 0.5, 4.0, 1.0], [0.25, 1.5, 1.0, 1.0]]))
    sequence = sampler_log_ratios(OLD, SAMPLER, MASK, "sequence")
    # row 0: 2 * 0.5 * 4 = 4; row 1: 0.25 * 1.5 = 0.375 (the padding's 7 - (-5) is not counted)
    assert sequence.shape == (2, 1)
    assert torch.allclose(sequence.exp().squeeze(1), torch.tensor([4.0, 0.375]))


@pytest.mark.parametrize(
    "mode, clip_min, clip_max, expected",
    [
        # truncate: clamp to [min, max]; padding's ratio is exp(0) = 1
        ("token_truncate", None, 3.0, [[2, 0.5, 3, 1], [0.25, 1.5, 1, 1]]),
        ("token_truncate", 0.5, 3.0, [[2, 0.5, 3, 1], [0.5, 1.5, 1, 1]]),
        ("token_truncate", 0.3, None, [[2, 0.5, 4, 1], [0.3, 1.5, 1, 1]]),
        # mask: 0 outside [min, max]; 0.5 is not below 0.3, 4 is above 3
        ("token_mask", None, 3.0, [[2, 0.5, 0, 1], [0.25, 1.5, 1, 1]]),
        ("token_mask", 0.3, 3.0, [[2, 0.5, 0, 1], [0, 1.5, 1, 1]]),
        # sequence: one ratio per row (4 and 0.375), on every column
        ("sequence_truncate", None, 3.0, [[3] * 4, [0.375] * 4]),
        ("sequence_truncate", 0.5, 3.0, [[3] * 4, [0.5] * 4]),
        ("sequence_mask", None, 3.0, [[0] * 4, [0.375] * 4]),
        ("sequence_mask", 0.5, None, [[4] * 4, [0] * 4]),
        ("sequence_mask", 0.25, 5.0, [[4] * 4, [0.375] * 4]),
    ],
)
def test_each_mode_by_hand(mode, clip_min, clip_max, expected):
    got = weights(mode, clip_min, clip_max)
    assert got.shape == MASK.shape
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float32), atol=1e-6)


def test_extreme_and_missing_logprobs_give_finite_weights():
    old = torch.tensor([[0.0, -float("inf"), 0.0, 0.0]])
    sampler = torch.tensor([[-1e4, 0.0, -float("inf"), float("nan")]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    for mode in SAMPLER_CORRECTION_MODES:
        for bounds in ((None, 3.0), (0.5, None), (0.5, 3.0)):
            assert torch.isfinite(sampler_importance_weights(old, sampler, mask, mode, *bounds)).all()
    # ratios e^1e4, e^-inf, e^inf, NaN -> e^20, e^-20, e^20 (clamped log-ratio), 1 (a NaN is no gap)
    trunc = sampler_importance_weights(old, sampler, mask, "token_truncate", 0.5, 3.0)
    assert trunc.tolist() == [[3.0, 0.5, 3.0, 1.0]]
    masked = sampler_importance_weights(old, sampler, mask, "token_mask", 0.5, 3.0)
    assert masked.tolist() == [[0.0, 0.0, 0.0, 1.0]]
    assert sampler_importance_weights(old, sampler, mask, "token_truncate", 0.5, None)[0, 0] == pytest.approx(
        math.exp(20.0), rel=1e-5
    )
    # a long sequence whose small gaps sum past the limit stays finite: e^min(100, 20)
    long = sampler_importance_weights(
        torch.ones(1, 100), torch.zeros(1, 100), torch.ones(1, 100), "sequence_mask", None, None
    )
    assert torch.isfinite(long).all() and long[0, 0].item() == pytest.approx(math.exp(20.0), rel=1e-5)


def test_matches_a_naive_loop():
    torch.manual_seed(0)
    old, sampler = torch.randn(5, 7), torch.randn(5, 7)
    mask = torch.rand(5, 7) > 0.3
    for mode in SAMPLER_CORRECTION_MODES:
        got = sampler_importance_weights(old, sampler, mask, mode, 0.6, 2.0)
        for i in range(5):
            gaps = [float(old[i, t] - sampler[i, t]) if mask[i, t] else 0.0 for t in range(7)]
            ratios = [math.exp(sum(gaps))] * 7 if mode.startswith("sequence") else [math.exp(g) for g in gaps]
            for t, r in enumerate(ratios):
                want = min(max(r, 0.6), 2.0) if mode.endswith("truncate") else (r if 0.6 <= r <= 2.0 else 0.0)
                assert got[i, t].item() == pytest.approx(want, rel=1e-5, abs=1e-6), (mode, i, t)


def test_stats_cover_loss_tokens_or_rows():
    # token_mask, max 3: loss-token weights 2, 0.5, 0, 0.25, 1.5 -> min 0, mean 4.25 / 5, max 2
    stats = importance_weight_stats(weights("token_mask"), MASK, "token_mask")
    assert torch.allclose(stats, torch.tensor([0.0, 0.85, 2.0]))
    # sequence_mask, max 3: one weight per row, 0 and 0.375
    stats = importance_weight_stats(weights("sequence_mask"), MASK, "sequence_mask")
    assert torch.allclose(stats, torch.tensor([0.0, 0.1875, 0.375]))
    empty = importance_weight_stats(torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool), "token_truncate")
    assert torch.isnan(empty).all()


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: sampler_importance_weights(OLD, SAMPLER, MASK, "token"),
            "mode must be one of token_truncate",
        ),
        (lambda: sampler_importance_weights(OLD, SAMPLER[:, :3], MASK), "must have the same"),
        (lambda: sampler_log_ratios(OLD, SAMPLER, MASK, "row"), "level must be 'token' or 'sequence'"),
    ],
)
def test_bad_inputs_name_what_was_expected(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ---------------------------------------------------------------- in the policy loss
def test_weights_scale_the_policy_term_and_its_gradient_but_not_the_kl():
    # on-policy (ratio 1), A = 1, dapo over 2 tokens: per-token loss -A * w + beta * kl
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    kw = dict(advantages=torch.tensor([1.0]), loss_mask=torch.ones(1, 2))
    w = torch.tensor([[3.0, 0.0]])
    plain = policy_loss("dapo", logprobs, logprobs.detach(), **kw)
    weighted = policy_loss("dapo", logprobs, logprobs.detach(), sampler_weights=w, **kw)
    assert plain.loss.item() == pytest.approx(-1.0)  # (-1 - 1) / 2
    assert weighted.loss.item() == pytest.approx(-1.5)  # (-3 + 0) / 2
    weighted.loss.backward()
    # d/dlogprob of -A * w * exp(logprob - old) / 2 at ratio 1: -w / 2
    assert logprobs.grad.tolist() == [[-1.5, 0.0]]
    kl = torch.ones(1, 2)
    with_kl = policy_loss(
        "dapo", logprobs, logprobs.detach(), sampler_weights=w, per_token_kl=kl, beta=0.5, **kw
    )
    assert with_kl.loss.item() == pytest.approx(-1.0)  # (-3 + 0.5 + 0 + 0.5) / 2: the KL is not weighted


def test_sequence_level_loss_takes_broadcast_weights():
    logprobs = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]])
    w = torch.tensor([[2.0, 2.0], [0.0, 0.0]])  # a sequence mode's weights: row 1 masked out
    out = policy_loss(
        "grpo", logprobs, logprobs, torch.tensor([1.0, 1.0]), torch.ones(2, 2),
        importance_sampling_level="sequence", sampler_weights=w,
    )  # fmt: skip
    assert out.loss.item() == pytest.approx(-1.0)  # (mean(-2, -2) + mean(0, 0)) / 2 sequences


def test_vespo_folds_the_weights_into_its_sequence_ratio():
    # on-policy, w = 2 * 2 on the two loss tokens: the sequence ratio is 4, not 1
    logprobs = torch.tensor([[-1.0, -1.0]])
    out = policy_loss(
        "vespo",
        logprobs,
        logprobs,
        torch.tensor([1.0]),
        torch.ones(1, 2),
        sampler_weights=torch.full((1, 2), 2.0),
    )
    assert out.ratio_mean.item() == pytest.approx(4.0)
    # phi(4) = exp(lam + k ln 4 - 4 lam), k = 2, lam = 3 for A >= 0; loss = -phi * A * (-1 - 1) / 2 tokens
    phi = math.exp(3 + 2 * math.log(4) - 12)
    assert out.loss.item() == pytest.approx(phi, rel=1e-5)


def test_sampler_weights_of_the_wrong_shape_are_refused():
    logprobs = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"sampler_weights shape \(2, 1\) must equal logprobs \(2, 3\)"):
        policy_loss(
            "dapo", logprobs, logprobs, torch.zeros(2), torch.ones(2, 3), sampler_weights=torch.ones(2, 1)
        )
