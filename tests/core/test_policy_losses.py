"""GRPO-family policy losses: hand-derived values and gradients for each loss_type and normaliser.

The fixture sets old_logprobs = 0, so logprobs = log(ratio) and d ratio / d logprob = ratio.
Sequence 0: ratios (1.0, 1.5, 0.5), all three tokens in the loss, advantage +1.
Sequence 1: ratios (1.1, 0.7, 2.0), the last token padding, advantage -2.
With epsilon 0.2 the per-token losses -min(r A, clip(r, 0.8, 1.2) A) are
  seq 0: -1.0, -1.2 (1.5 clipped high: no gradient), -0.5 (sum -2.7 over 3 tokens)
  seq 1: +2.2, +1.6 (0.7 clipped low: no gradient)   (sum +3.8 over 2 tokens)
"""

import math

import pytest
import torch

from rlhfkit.core import POLICY_LOSSES, entropy_mask, kl_penalty, per_token_kl, policy_loss

RATIOS = torch.tensor([[1.0, 1.5, 0.5], [1.1, 0.7, 2.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
ADVANTAGES = torch.tensor([1.0, -2.0])


def run(loss_type, ratios=RATIOS, mask=MASK, advantages=ADVANTAGES, **kwargs):
    logprobs = ratios.log().clone().requires_grad_(True)
    out = policy_loss(loss_type, logprobs, torch.zeros_like(logprobs), advantages, mask, **kwargs)
    out.loss.backward()
    return out, logprobs.grad


def test_grpo_is_the_mean_of_sequence_means():
    out, grad = run("grpo")
    # (-2.7/3 + 3.8/2) / 2 = (-0.9 + 1.9) / 2
    torch.testing.assert_close(out.loss, torch.tensor(0.5))
    # unclipped token: -A r / (n_tokens * n_sequences); clipped and padding tokens: 0
    expected = torch.tensor([[-1.0 / 6, 0.0, -0.5 / 6], [2.2 / 4, 0.0, 0.0]])
    torch.testing.assert_close(grad, expected)


def test_clip_statistics_count_loss_tokens_with_a_vanished_gradient():
    out, _ = run("grpo")
    # low: 0.7 with A < 0; high: 1.5 with A > 0; out of 5 loss tokens (the padded 2.0 is ignored)
    torch.testing.assert_close(out.clip_ratio_low, torch.tensor(0.2))
    torch.testing.assert_close(out.clip_ratio_high, torch.tensor(0.2))
    torch.testing.assert_close(out.clip_ratio_region, torch.tensor(0.4))
    torch.testing.assert_close(out.ratio_mean, torch.tensor(4.8 / 5))
    assert out.kl_mean is None and not out.ratio_mean.requires_grad


def test_bnpo_and_dapo_divide_the_token_sum_by_the_tokens():
    # (-2.7 + 3.8) / 5 loss tokens, for one micro-batch both are the token mean
    for loss_type in ("bnpo", "dapo"):
        out, grad = run(loss_type)
        torch.testing.assert_close(out.loss, torch.tensor(0.22))
        torch.testing.assert_close(grad, torch.tensor([[-0.2, 0.0, -0.1], [0.44, 0.0, 0.0]]))


def test_dr_grpo_divides_by_sequences_times_max_completion_length():
    out, grad = run("dr_grpo", max_completion_length=4)
    torch.testing.assert_close(out.loss, torch.tensor(1.1 / 8))  # 1.1 / (2 * 4)
    torch.testing.assert_close(grad, torch.tensor([[-1.0 / 8, 0.0, -0.5 / 8], [2.2 / 8, 0.0, 0.0]]))


def test_clip_higher_lets_a_larger_ratio_through():
    # epsilon_high 0.6: 1.5 < 1.6 now unclipped -> -1.5; loss (-1 - 1.5 - 0.5 + 3.8) / 5
    out, grad = run("dapo", epsilon_high=0.6)
    torch.testing.assert_close(out.loss, torch.tensor(0.16))
    assert grad[0, 1].item() == pytest.approx(-1.5 / 5)
    torch.testing.assert_close(out.clip_ratio_high, torch.tensor(0.0))


def test_delta_bounds_the_unclipped_ratio_for_negative_advantages():
    # one token, ratio 2, A = -1, epsilon 0.2: min(-2, -1.2) = -2 -> loss 2 with gradient -A r = 2
    ratios, mask, advantages = torch.tensor([[2.0]]), torch.ones(1, 1), torch.tensor([-1.0])
    out, grad = run("dapo", ratios, mask, advantages)
    assert (out.loss.item(), grad.item()) == pytest.approx((2.0, 2.0))
    # delta 1.5 clamps the ratio: min(-1.5, -1.2) = -1.5 -> loss 1.5, and the clamp has no gradient
    out, grad = run("dapo", ratios, mask, advantages, delta=1.5)
    assert (out.loss.item(), grad.item()) == pytest.approx((1.5, 0.0))


def test_gspo_uses_the_length_normalised_sequence_ratio():
    # s0 = exp(mean(log 1, log 1.5, log 0.5)) = 0.75 ** (1/3); s1 = exp(mean(log 1.1, log 0.7)) = 0.77 ** 0.5
    s0, s1 = 0.75 ** (1 / 3), 0.77**0.5
    out, grad = run("gspo")
    # both inside [0.8, 1.2]: loss = mean(-s0 * 1, -s1 * -2)
    torch.testing.assert_close(out.loss, torch.tensor((-s0 + 2 * s1) / 2))
    # d/dlogprob_t = -A s / (n_tokens * n_sequences): every loss token of a sequence gets the same share
    expected = torch.tensor([[-s0 / 6] * 3, [2 * s1 / 4, 2 * s1 / 4, 0.0]])
    torch.testing.assert_close(grad, expected)
    torch.testing.assert_close(out.ratio_mean, torch.tensor((s0 + s1) / 2))  # a mean over sequences
    same, same_grad = run("grpo", importance_sampling_level="sequence")
    torch.testing.assert_close((same.loss, same_grad), (out.loss, grad))


def test_gspo_clips_whole_sequences():
    # every token ratio 1.5 with A > 0: s = 1.5 > 1.2 clipped -> loss -1.2, no gradient anywhere
    out, grad = run("gspo", torch.full((1, 3), 1.5), torch.ones(1, 3), torch.tensor([1.0]))
    torch.testing.assert_close(out.loss, torch.tensor(-1.2))
    torch.testing.assert_close(grad, torch.zeros(1, 3))
    torch.testing.assert_close(out.clip_ratio_high, torch.tensor(1.0))


def test_cispo_caps_a_detached_weight_and_keeps_every_gradient():
    # weights min(r, 1.2): (1, 1.2, 0.5), (1.1, 0.7); loss = -sum(w A log r) / 5 tokens
    out, grad = run("cispo", epsilon_high=1.2)
    token_losses = [
        -1.2 * math.log(1.5),
        -0.5 * math.log(0.5),
        2 * 1.1 * math.log(1.1),
        2 * 0.7 * math.log(0.7),
    ]
    torch.testing.assert_close(out.loss, torch.tensor(sum(token_losses) / 5))
    # d/dlogprob = -w A / 5: the capped token (1.5) still has a gradient, the weight itself has none
    torch.testing.assert_close(grad, torch.tensor([[-0.2, -0.24, -0.1], [0.44, 0.28, 0.0]]))
    torch.testing.assert_close(out.clip_ratio_high, torch.tensor(0.2))  # 1.5 > 1.2 with A > 0
    torch.testing.assert_close(out.clip_ratio_low, torch.tensor(0.0))


def test_kl_term_is_added_per_token_before_normalisation():
    kl = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 7.0]])  # the 7 sits on padding and must not count
    out, _ = run("grpo", per_token_kl=kl, beta=0.1)
    torch.testing.assert_close(out.loss, torch.tensor(0.5 + 0.1))  # every sequence's KL mean is 1
    torch.testing.assert_close(out.kl_mean, torch.tensor(1.0))
    out, _ = run("grpo", per_token_kl=kl, beta=0.0)  # beta 0: logged, not in the loss
    torch.testing.assert_close(out.loss, torch.tensor(0.5))


def test_entropy_mask_drops_tokens_from_the_policy_term_but_not_the_normaliser():
    keep = torch.tensor([[False, True, True], [True, True, False]])
    out, grad = run("grpo", entropy_mask=keep)
    # seq 0 loses its -1.0: (-1.7/3 + 3.8/2) / 2
    torch.testing.assert_close(out.loss, torch.tensor((-1.7 / 3 + 1.9) / 2))
    assert grad[0, 0].item() == 0.0


def test_vectorised_grpo_and_dr_grpo_match_a_loop():
    gen = torch.Generator().manual_seed(0)
    ratios = torch.exp(0.3 * torch.randn(4, 6, generator=gen))
    mask = (torch.rand(4, 6, generator=gen) > 0.3).long()
    mask[:, 0] = 1
    advantages = torch.randn(4, generator=gen)
    seq_means, token_sum = [], 0.0
    for i in range(4):
        losses = []
        for t in range(6):
            if mask[i, t]:
                r, a = ratios[i, t].item(), advantages[i].item()
                losses.append(-min(r * a, min(max(r, 0.8), 1.28) * a))
        seq_means.append(sum(losses) / len(losses))
        token_sum += sum(losses)
    out, _ = run("grpo", ratios, mask, advantages, epsilon_high=0.28)
    assert out.loss.item() == pytest.approx(sum(seq_means) / 4, rel=1e-5)
    out, _ = run("dr_grpo", ratios, mask, advantages, epsilon_high=0.28, max_completion_length=6)
    assert out.loss.item() == pytest.approx(token_sum / 24, rel=1e-5)


def _micro_batch_sum(loss_type, logprobs, old, advantages, mask, kl, **kwargs):
    """Loss and gradient of one step split into two micro-batches of two sequences."""
    step = {"step_tokens": mask.sum().item(), "step_sequences": 4}
    total = sum(
        policy_loss(
            loss_type,
            logprobs[rows],
            old[rows],
            advantages[rows],
            mask[rows],
            per_token_kl=kl[rows],
            **step,
            **kwargs,
        ).loss
        for rows in (slice(0, 2), slice(2, 4))
    )
    return total, torch.autograd.grad(total, logprobs)[0]


@pytest.mark.parametrize(
    "loss_type", ["grpo", "bnpo", "dapo", "dr_grpo", "gspo", "cispo", "sapo", "vespo", "luspo"]
)
def test_micro_batch_losses_sum_to_the_step_loss(loss_type):
    gen = torch.Generator().manual_seed(0)
    logprobs = (-torch.rand(4, 5, generator=gen)).requires_grad_(True)
    old = logprobs.detach() + 0.2 * torch.randn(4, 5, generator=gen)
    advantages = torch.randn(4, generator=gen)
    # different lengths per sequence, but 6 tokens in each micro-batch (bnpo is only exact then)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]])
    kwargs = {"max_completion_length": 5, "epsilon_high": 0.28, "beta": 0.05}
    kl = per_token_kl(logprobs, old - 0.1, sampling_logprobs=old)
    full = policy_loss(loss_type, logprobs, old, advantages, mask, per_token_kl=kl, **kwargs).loss
    full_grad = torch.autograd.grad(full, logprobs, retain_graph=True)[0]
    total, grad = _micro_batch_sum(loss_type, logprobs, old, advantages, mask, kl, **kwargs)
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(grad, full_grad)


def test_registry_has_every_loss_type():
    assert set(POLICY_LOSSES) == {
        "grpo",
        "bnpo",
        "dapo",
        "dr_grpo",
        "gspo",
        "cispo",
        "sapo",
        "vespo",
        "luspo",
    }


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"loss_type": "ppo"}, "loss_type"),
        ({"loss_type": "dr_grpo"}, "max_completion_length"),
        ({"beta": 0.1}, "per_token_kl"),
        ({"importance_sampling_level": "batch"}, "importance_sampling_level"),
        ({"advantages": torch.zeros(2, 3)}, "advantages"),
        ({"loss_mask": torch.ones(2, 2)}, "loss_mask"),
        ({"per_token_kl": torch.zeros(1, 3)}, "per_token_kl"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    args = {
        "loss_type": "grpo",
        "logprobs": torch.zeros(2, 3),
        "old_logprobs": torch.zeros(2, 3),
        "advantages": torch.zeros(2),
        "loss_mask": torch.ones(2, 3),
        **kwargs,
    }
    with pytest.raises(ValueError, match=match):
        policy_loss(
            args.pop("loss_type"),
            args.pop("logprobs"),
            args.pop("old_logprobs"),
            args.pop("advantages"),
            args.pop("loss_mask"),
            **args,
        )


def test_bias_corrected_k3_has_the_reverse_kl_gradient_on_policy():
    # logprob 0, ref log 2: k3 = 2 - log 2 - 1 and d k3 / d logprob = 1 - 2 = -1. The importance factor
    # exp(logprob - sampling) is 1 on policy, yet adds k3 to the gradient: -1 + 1 - log 2 = -log 2, the
    # on-policy gradient of KL(pi || ref) for this sample, d/dlogprob of (logprob - ref) * pi-weighted
    logprobs = torch.zeros(1, 1, requires_grad=True)
    ref = torch.full((1, 1), math.log(2))
    plain = per_token_kl(logprobs, ref)
    assert plain.item() == pytest.approx(1 - math.log(2))
    assert torch.autograd.grad(plain.sum(), logprobs)[0].item() == pytest.approx(-1.0)
    corrected = per_token_kl(logprobs, ref, sampling_logprobs=logprobs.detach())
    assert corrected.item() == pytest.approx(1 - math.log(2))
    assert torch.autograd.grad(corrected.sum(), logprobs)[0].item() == pytest.approx(-math.log(2))
    # off policy the value is reweighted: sampling log-prob -log 2 -> factor 2
    assert per_token_kl(logprobs, ref, sampling_logprobs=ref.neg()).item() == pytest.approx(
        2 - 2 * math.log(2)
    )


def test_k1_and_k2_names_reach_the_existing_estimators():
    logprobs, ref = torch.tensor([[0.5, -1.0]]), torch.tensor([[0.0, 0.0]])
    torch.testing.assert_close(per_token_kl(logprobs, ref, "k1"), kl_penalty(logprobs, ref, "kl"))
    torch.testing.assert_close(per_token_kl(logprobs, ref, "k2"), torch.tensor([[0.125, 0.5]]))
    with pytest.raises(ValueError, match="k1, k2"):
        per_token_kl(logprobs, ref, "k4")


def test_entropy_mask_keeps_the_top_quantile_of_loss_tokens():
    entropies = torch.tensor([[0.0, 1.0, 2.0, 9.0], [3.0, 4.0, 5.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])  # the 9s are padding: never kept, never counted
    # loss entropies 0..5; quantile 0.4 -> threshold = the 0.6 quantile = 0 + 0.6 * 5 = 3 -> keeps 3, 4, 5
    expected = torch.tensor([[False, False, False, False], [True, True, True, False]])
    torch.testing.assert_close(entropy_mask(entropies, mask, 0.4), expected)
    torch.testing.assert_close(entropy_mask(entropies, mask, 1.0), mask.bool())
    torch.testing.assert_close(entropy_mask(entropies, mask, 0.0).sum(), torch.tensor(1))  # only the max
    with pytest.raises(ValueError, match="quantile"):
        entropy_mask(entropies, mask, 1.5)


def test_entropy_mask_takes_its_threshold_from_pooled_entropies():
    entropies = torch.tensor([[0.0, 1.0, 2.0, 9.0], [3.0, 4.0, 5.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])
    # another process's tokens join: the median of 0..5, 10, 11, 12 is 4 (this process's alone: 2.5)
    pooled = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 11.0, 12.0])
    expected = torch.tensor([[False, False, False, False], [False, True, True, False]])
    torch.testing.assert_close(entropy_mask(entropies, mask, 0.5, pooled=pooled), expected)
    assert not entropy_mask(entropies, mask, 0.5, pooled=torch.empty(0)).any()  # nothing to rank
