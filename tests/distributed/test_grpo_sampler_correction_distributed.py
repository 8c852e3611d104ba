"""GRPO's sampler correction under 2 processes: the importance-ratio statistics are those of every rank."""

import pytest
from launch import launch

pytestmark = pytest.mark.slow


def test_importance_ratio_statistics_cover_every_rank():
    r0, r1 = launch("grpo_correction_worker.py")
    assert r0 == r1
    prefix = "sampling/importance_sampling_ratio/"
    # rank 0's weights are all 2, rank 1's all 0.5: min over ranks, mean of the ranks' means, max over ranks
    assert r0[prefix + "min"] == pytest.approx(0.5, rel=1e-3)
    assert r0[prefix + "mean"] == pytest.approx(1.25, rel=1e-3)
    assert r0[prefix + "max"] == pytest.approx(2.0, rel=1e-3)
