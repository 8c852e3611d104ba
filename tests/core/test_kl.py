import math

import pytest
import torch

from rlhfkit.core import KL_ESTIMATORS, AdaptiveKLController, FixedKLController, kl_penalty

LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-1.5, -1.0]])


def test_estimators_hand_values():
    # logp - ref = (0.5, -1.0)
    torch.testing.assert_close(kl_penalty(LOGP, REF, "kl"), torch.tensor([[0.5, -1.0]]))
    torch.testing.assert_close(kl_penalty(LOGP, REF, "abs"), torch.tensor([[0.5, 1.0]]))
    # 0.5 * (0.25, 1.0)
    torch.testing.assert_close(kl_penalty(LOGP, REF, "mse"), torch.tensor([[0.125, 0.5]]))
    # k3 with x = ref - logp = (-0.5, 1.0): exp(x) - x - 1
    expected = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]
    torch.testing.assert_close(kl_penalty(LOGP, REF, "k3"), torch.tensor([expected]))


def test_full_kind_uses_logits():
    logits = torch.tensor([[[0.0, math.log(3.0)]]])  # p = (1/4, 3/4)
    ref_logits = torch.zeros(1, 1, 2)  # q = (1/2, 1/2)
    out = kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "full", logits, ref_logits)
    assert out.item() == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5), rel=1e-5)
    with pytest.raises(ValueError, match="logits"):
        kl_penalty(LOGP, REF, "full")


def test_k3_is_nonnegative_and_unknown_kind_lists_names():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(100, generator=g), torch.randn(100, generator=g)
    assert (kl_penalty(a, b, "k3") >= 0).all()
    with pytest.raises(ValueError, match="kl, abs, mse, full, k3"):
        kl_penalty(LOGP, REF, "k4")
    assert set(KL_ESTIMATORS) == {"kl", "abs", "mse", "full", "k3"}


def test_adaptive_controller_updates_and_clips():
    ctl = AdaptiveKLController(init_kl_coef=0.2, target=6.0, horizon=10000)
    # kl 7.5: error = 7.5/6 - 1 = 0.25 -> clipped 0.2; mult = 1 + 0.2 * 256/10000 = 1.00512
    ctl.update(7.5, n_steps=256)
    assert ctl.value == pytest.approx(0.2 * 1.00512)
    # kl 5.4: error = 0.9 - 1 = -0.1; mult = 1 - 0.1 * 1000/10000 = 0.99
    ctl.update(torch.tensor(5.4), n_steps=1000)
    assert ctl.value == pytest.approx(0.2 * 1.00512 * 0.99)


def test_controller_state_round_trip():
    ctl = AdaptiveKLController(0.1, 6.0, 100)
    ctl.update(12.0, 10)
    restored = AdaptiveKLController(0.5, 1.0, 1)
    restored.load_state_dict(ctl.state_dict())
    assert restored.state_dict() == ctl.state_dict()
    fixed = FixedKLController(0.05)
    fixed.update(100.0, 10)
    assert fixed.value == 0.05
    other = FixedKLController(1.0)
    other.load_state_dict(fixed.state_dict())
    assert other.value == 0.05


def test_adaptive_controller_rejects_bad_target():
    with pytest.raises(ValueError, match="target"):
        AdaptiveKLController(0.1, 0.0, 100)
