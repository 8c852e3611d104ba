"""The fused finiteness check agrees with an element-wise check, including its overflow fallback."""

import torch

from rlhfkit.trainers.common.guards import non_finite_names


def test_fused_check_matches_elementwise():
    finite = [torch.randn(3, 4), torch.randn(5)]
    assert non_finite_names(gradients=finite) == []
    assert non_finite_names(gradients=[*finite, torch.tensor([1.0, float("nan")])]) == ["gradients"]
    assert non_finite_names(gradients=[*finite, torch.tensor([-float("inf")])]) == ["gradients"]


def test_huge_finite_values_are_not_flagged():
    # 3e38 squared overflows float32, so the fast 2-norm is inf; the exact fallback must still say finite
    huge = [torch.tensor([3e38, -3e38, 1.0])]
    assert not torch.isfinite(torch._foreach_norm(huge)[0])
    assert non_finite_names(gradients=huge) == []
