"""GDPO's decoupled advantages (TRL's multi_objective_aggregation="normalize_then_sum"), by hand and
against a plain loop."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from rlhfkit.core.advantages import decoupled_group_advantages

EPS = 1e-4


def test_each_reward_is_normalised_in_its_group_then_the_weighted_sum_over_the_batch():
    # two reward sources, two groups of two completions
    per_source = torch.tensor([[1.0, 3.0, 0.0, 0.0], [2.0, 2.0, 4.0, 0.0]])
    weights = torch.tensor([1.0, 0.5])
    out = decoupled_group_advantages(per_source, weights, group_size=2)
    # source 0, group 0: mean 2, unbiased std sqrt(2): -/+ 1 / (sqrt 2 + eps) = -/+ a; group 1: all equal -> 0
    a = 1 / (math.sqrt(2) + EPS)
    # source 1, group 0: all equal -> 0; group 1: mean 2, std 2 sqrt 2: +/- 2 / (2 sqrt 2 + eps) = +/- b
    b = 2 / (2 * math.sqrt(2) + EPS)
    summed = [-a, a, 0.5 * b, -0.5 * b]  # weights 1 and 0.5
    # over the batch: mean 0, unbiased std sqrt(sum x^2 / 3)
    std = math.sqrt(sum(x * x for x in summed) / 3)
    expected = torch.tensor([x / (std + EPS) for x in summed])
    torch.testing.assert_close(out, expected)


def test_a_reward_that_does_not_apply_is_left_out_and_a_row_without_any_gets_zero():
    nan = float("nan")
    # source 1 applies only to row 1 of group 0: a group with one score has no std, so it adds nothing there
    per_source = torch.tensor([[1.0, 3.0, nan, 5.0], [nan, 7.0, nan, 1.0]])
    out = decoupled_group_advantages(per_source, torch.ones(2), group_size=2)
    assert out[2] == 0.0  # no source applies to row 2
    # source 0 group 0: -/+ a; group 1 (row 3 alone) nothing; source 1 group 1 (row 3 alone) nothing
    a = 1 / (math.sqrt(2) + EPS)
    summed = torch.tensor([-a, a, 0.0])  # rows 0, 1, 3 (row 3's sum over no usable source is 0)
    expected = (summed - summed.mean()) / (summed.std() + EPS)
    torch.testing.assert_close(out[[0, 1, 3]], expected)


def _loop(per_source, weights, group_size):
    sources, n = len(per_source), len(per_source[0])
    normalised = [[math.nan] * n for _ in range(sources)]
    for s in range(sources):
        for start in range(0, n, group_size):
            scored = [v for v in per_source[s][start : start + group_size] if not math.isnan(v)]
            if len(scored) < 2:
                continue
            mean, std = statistics.mean(scored), statistics.stdev(scored)
            for i in range(start, start + group_size):
                normalised[s][i] = (per_source[s][i] - mean) / (std + EPS)
    sums = []
    for i in range(n):
        if all(math.isnan(per_source[s][i]) for s in range(sources)):
            sums.append(math.nan)
        else:
            sums.append(
                sum(weights[s] * normalised[s][i] for s in range(sources) if not math.isnan(normalised[s][i]))
            )
    kept = [x for x in sums if not math.isnan(x)]
    mean, std = statistics.mean(kept), statistics.stdev(kept)
    return [0.0 if math.isnan(x) else (x - mean) / (std + EPS) for x in sums]


def test_vectorised_matches_a_loop():
    generator = torch.Generator().manual_seed(0)
    per_source = torch.randn(3, 24, generator=generator, dtype=torch.float64)
    per_source[torch.rand(3, 24, generator=generator) < 0.2] = float("nan")
    weights = [1.0, 0.5, 2.0]
    out = decoupled_group_advantages(per_source, torch.tensor(weights, dtype=torch.float64), group_size=4)
    expected = torch.tensor(_loop(per_source.tolist(), weights, 4), dtype=torch.float64)
    torch.testing.assert_close(out, expected)


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"per_source must be \(S, N\) and weights \(S,\)"):
        decoupled_group_advantages(torch.zeros(2, 4), torch.ones(3), group_size=2)
    with pytest.raises(ValueError, match="not a multiple of group_size=3"):
        decoupled_group_advantages(torch.zeros(2, 4), torch.ones(2), group_size=3)
