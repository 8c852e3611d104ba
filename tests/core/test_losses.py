import math

import pytest
import torch
import torch.nn.functional as F

from rlhfkit.core import DPO_LOSSES, dpo_loss, pairwise_reward_loss, ppo_policy_loss, ppo_value_loss


def test_ppo_policy_loss_hand_values():
    # ratios exp(ln 1.5) = 1.5 and exp(ln 0.5) = 0.5, third token masked
    logprobs = torch.tensor([[math.log(1.5), math.log(0.5), 5.0]])
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, 1.0, 100.0]])
    mask = torch.tensor([[True, True, False]])
    out = ppo_policy_loss(logprobs, old, adv, mask, cliprange=0.2)
    # token 0: max(-1.5, -1.2) = -1.2 (clipped); token 1: max(-0.5, -0.8) = -0.5 (unclipped)
    assert out.loss.item() == pytest.approx((-1.2 - 0.5) / 2)
    assert out.clipfrac.item() == pytest.approx(0.5)
    # approxkl = 0.5 * mean((ln 1.5)^2, (ln 0.5)^2)
    assert out.approxkl.item() == pytest.approx(0.5 * (math.log(1.5) ** 2 + math.log(0.5) ** 2) / 2, rel=1e-5)
    # ratio mean 1.0, population variance 0.25
    assert out.ratio_mean.item() == pytest.approx(1.0) and out.ratio_var.item() == pytest.approx(0.25)


def test_ppo_policy_loss_gradient_and_sequence_level():
    logprobs = torch.zeros(4, requires_grad=True)
    out = ppo_policy_loss(logprobs, torch.zeros(4), torch.tensor([1.0, -1.0, 2.0, 0.0]), None, 0.2)
    out.loss.backward()
    # at ratio 1 nothing is clipped: d/dlogp mean(-A * ratio) = -A / 4
    torch.testing.assert_close(logprobs.grad, torch.tensor([-0.25, 0.25, -0.5, 0.0]))
    assert not out.clipfrac.requires_grad
    with pytest.raises(ValueError, match="same shape"):
        ppo_policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4), None, 0.2)


def test_ppo_value_loss_hand_values():
    vpreds = torch.tensor([[2.0, 0.0, 9.0]])
    old = torch.tensor([[1.0, 0.0, 0.0]])
    returns = torch.tensor([[3.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    out = ppo_value_loss(vpreds, old, returns, mask, cliprange_value=0.5)
    # token 0: unclipped (2-3)^2 = 1; clipped 1.5 -> (1.5-3)^2 = 2.25 -> 2.25 (clipped wins)
    # token 1: v = old = 0 -> both (0-1)^2 = 1 -> 1
    assert out.loss.item() == pytest.approx(0.5 * (2.25 + 1.0) / 2)
    assert out.clipfrac.item() == pytest.approx(0.5)
    assert out.vpred_error.item() == pytest.approx(1.0)


def test_dpo_sigmoid_hand_values():
    pc, pr = torch.tensor([-1.0]), torch.tensor([-3.0])
    rc, rr = torch.tensor([-2.0]), torch.tensor([-2.0])
    # logits = (-1 - -3) - (-2 - -2) = 2; beta 0.5 -> loss = -logsigmoid(1)
    losses, chosen, rejected = dpo_loss(pc, pr, rc, rr, beta=0.5)
    assert losses.item() == pytest.approx(math.log1p(math.exp(-1.0)))
    # implicit rewards 0.5 * (-1 - -2) = 0.5 and 0.5 * (-3 - -2) = -0.5
    assert chosen.item() == pytest.approx(0.5) and rejected.item() == pytest.approx(-0.5)
    # label smoothing 0.1: 0.9 * softplus(-1) + 0.1 * softplus(1)
    losses, _, _ = dpo_loss(pc, pr, rc, rr, beta=0.5, label_smoothing=0.1)
    expected = 0.9 * math.log1p(math.exp(-1.0)) + 0.1 * math.log1p(math.exp(1.0))
    assert losses.item() == pytest.approx(expected)


def test_dpo_hinge_ipo_reference_free():
    pc, pr = torch.tensor([-1.0]), torch.tensor([-3.0])
    rc, rr = torch.tensor([-2.0]), torch.tensor([-2.0])
    # hinge: relu(1 - 0.25 * 2) = 0.5
    assert dpo_loss(pc, pr, rc, rr, beta=0.25, loss_type="hinge")[0].item() == pytest.approx(0.5)
    # ipo, one token each: (2 - 1/(2*0.25))^2 = 0
    ones = torch.tensor([1])
    ipo = dpo_loss(pc, pr, rc, rr, beta=0.25, loss_type="ipo", chosen_lengths=ones, rejected_lengths=ones)
    assert ipo[0].item() == pytest.approx(0.0)
    # reference-free with rc = -5: logits = pc - pr = 2 regardless of the reference
    losses, chosen, _ = dpo_loss(pc, pr, torch.tensor([-5.0]), rr, beta=0.5, reference_free=True)
    assert losses.item() == pytest.approx(math.log1p(math.exp(-1.0)))
    assert chosen.item() == pytest.approx(-0.5)  # 0.5 * pc
    assert len(DPO_LOSSES) == 15 and {"sigmoid", "hinge", "ipo"} <= set(DPO_LOSSES)


def test_dpo_rewards_detached_and_bad_input():
    pc = torch.tensor([-1.0], requires_grad=True)
    losses, chosen, _ = dpo_loss(pc, torch.tensor([-2.0]), torch.tensor([-1.0]), torch.tensor([-1.0]))
    assert losses.requires_grad and not chosen.requires_grad
    with pytest.raises(ValueError, match="sigmoid, hinge, ipo"):
        dpo_loss(pc, pc, pc, pc, loss_type="kto")
    with pytest.raises(ValueError, match="policy_rejected_logps"):
        dpo_loss(pc, torch.zeros(2), pc, pc)


def test_pairwise_reward_loss():
    rc, rr = torch.tensor([2.0, 1.0]), torch.tensor([0.0, 1.0])
    # gaps 2 and 0: mean(softplus(-2), ln 2)
    expected = (math.log1p(math.exp(-2.0)) + math.log(2.0)) / 2
    assert pairwise_reward_loss(rc, rr).item() == pytest.approx(expected)
    # margin 1 on both: gaps 1 and -1
    with_margin = pairwise_reward_loss(rc, rr, margin=torch.tensor([1.0, 1.0]))
    assert with_margin.item() == pytest.approx(
        (F.softplus(torch.tensor(-1.0)) + F.softplus(torch.tensor(1.0))).item() / 2
    )
    # centring: + 0.01 * mean((2+0)^2, (1+1)^2) = + 0.04
    centred = pairwise_reward_loss(rc[:, None], rr[:, None], center_rewards_coefficient=0.01)
    assert centred.item() == pytest.approx(expected + 0.04)
