"""TRL's DPO loss menu against numbers worked out by hand, the f-divergence scores, and a weighted list of
losses. One pair unless said: chosen log-ratio +1, rejected -1 (policy -1 / -3, reference -2 / -2),
beta 0.5 (margin 1), completions of 2 and 4 tokens."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.core.losses import DPO_LOSSES, dpo_loss, f_divergence_scores


def logsig(x: float) -> float:
    return -math.log1p(math.exp(-x))


def sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


PC, PR, RC, RR = (torch.tensor([v]) for v in (-1.0, -3.0, -2.0, -2.0))
LENGTHS = {"chosen_lengths": torch.tensor([2]), "rejected_lengths": torch.tensor([4])}

ONE_PAIR = {
    "sigmoid": -logsig(1),
    "hinge": 0.0,
    "ipo": (1 / 2 + 1 / 4 - 1) ** 2,  # per-token scores 1/2 and -1/4, target 1/(2 beta) = 1
    "exo_pair": sig(1) * (logsig(1) - math.log(0.999)) + sig(-1) * (logsig(-1) - math.log(0.001)),
    "nca_pair": -logsig(0.5) - 0.5 * logsig(-0.5) - 0.5 * logsig(0.5),
    "bco_pair": -2 * logsig(0.5),
    "apo_zero": 1 - sig(0.5) + sig(-0.5),
    "apo_down": sig(0.5) + 1 - sig(1),
    "discopop": -logsig(1) * (1 - sig(20)) + math.exp(-1) * sig(20),  # tau 0.05: mix sigmoid(1 / 0.05)
    "sft": 0.5,  # -(-1) / 2 tokens
    "sigmoid_norm": -logsig(0.5 * 0.75),
}


@pytest.mark.parametrize("name", sorted(ONE_PAIR))
def test_one_pair_by_hand(name):
    loss = dpo_loss(PC, PR, RC, RR, beta=0.5, loss_type=name, **LENGTHS)[0]
    assert loss.item() == pytest.approx(ONE_PAIR[name], rel=1e-5, abs=1e-7)


def test_robust_and_sppo_hard():
    robust = dpo_loss(PC, PR, RC, RR, beta=0.5, loss_type="robust", label_smoothing=0.1)[0]
    assert robust.item() == pytest.approx((-0.9 * logsig(1) + 0.1 * logsig(-1)) / 0.8)
    sppo = dpo_loss(PC, PR, RC, RR, beta=0.25, loss_type="sppo_hard")[0]
    assert sppo.item() == pytest.approx((1 - 2) ** 2 + (-1 + 2) ** 2)  # targets +-1/(2 beta) = +-2


def test_aot_pairs_the_sorted_quantities_of_the_batch():
    pc, pr = torch.tensor([-1.0, -5.0]), torch.tensor([-3.0, -2.0])
    ref = torch.tensor([-2.0, -2.0])
    # paired: policy log-ratio gaps (2, -3) sorted (-3, 2) minus the reference's (0, 0), times beta
    aot = dpo_loss(pc, pr, ref, ref, beta=0.5, loss_type="aot")[0]
    torch.testing.assert_close(aot, torch.tensor([-logsig(-1.5), -logsig(1.0)]))
    # unpaired: chosen log-ratios (1, -3) sorted (-3, 1), rejected (-1, 0) sorted (-1, 0)
    unpaired = dpo_loss(pc, pr, ref, ref, beta=0.5, loss_type="aot_unpaired")[0]
    torch.testing.assert_close(unpaired, torch.tensor([-logsig(-1.0), -logsig(0.5)]))


def test_a_weighted_list_of_losses():
    loss = dpo_loss(
        PC, PR, RC, RR, beta=0.5, loss_type=["sigmoid", "sft"], loss_weights=[1.0, 0.5], **LENGTHS
    )
    assert loss[0].item() == pytest.approx(-logsig(1) + 0.25)
    with pytest.raises(ValueError, match="loss_weights has 1 entries for 2 loss types"):
        dpo_loss(PC, PR, RC, RR, loss_type=["sigmoid", "hinge"], loss_weights=[1.0])
    # without lengths the log-probs count as per-token averages already (TRL 0.x's IPO inputs)
    ipo = dpo_loss(PC, PR, RC, RR, beta=0.5, loss_type="ipo")[0]
    assert ipo.item() == pytest.approx((2 - 1) ** 2)


@pytest.mark.parametrize(
    "kind, alpha, chosen, rejected",
    [
        ("reverse_kl", 1.0, 1.0, -1.0),
        ("forward_kl", 1.0, 1 - math.exp(-1), 1 - math.exp(1)),
        ("js_divergence", 1.0, math.log(2) + logsig(1), math.log(2) + logsig(-1)),
        ("alpha_divergence", 0.5, 2 * (1 - math.exp(-0.5)), 2 * (1 - math.exp(0.5))),
        ("alpha_divergence", 1.0, 1.0, -1.0),  # the limit alpha -> 1 is reverse KL
    ],
)
def test_f_divergence_scores_and_their_dpo_loss(kind, alpha, chosen, rejected):
    scores = f_divergence_scores(torch.tensor([1.0, -1.0]), kind, alpha)
    torch.testing.assert_close(scores, torch.tensor([chosen, rejected]))
    loss = dpo_loss(PC, PR, RC, RR, beta=0.5, f_divergence_type=kind, f_alpha_divergence_coef=alpha)[0]
    assert loss.item() == pytest.approx(-logsig(0.5 * (chosen - rejected)), rel=1e-5)


def test_every_loss_but_apo_down_raises_the_chosen():
    for name in DPO_LOSSES:
        pc = torch.tensor([-1.0], requires_grad=True)
        loss = dpo_loss(pc, PR, RC, RR, beta=0.25, loss_type=name, label_smoothing=0.1, **LENGTHS)[0]
        loss.sum().backward()
        # descent raises the chosen log-prob; APO-down lowers it (the chosen are worse than the model)
        assert (pc.grad.item() > 0) == (name == "apo_down"), name
