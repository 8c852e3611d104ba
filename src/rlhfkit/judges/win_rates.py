"""The win rate of a model against a reference, with its 95% Wilson score interval.

Ties count as half a win and half a loss: with W wins, T ties and n judgements the rate is
p = (W + T/2) / n, and the interval is Wilson's for p on n trials,
    (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n),   z = 1.96 for 95%.
Wilson's interval, unlike the normal approximation p ± z·sqrt(p(1-p)/n), stays inside [0, 1] and does
not shrink to a point at 0% or 100% wins. Counting a tie as half keeps p a mean of n values in {0, ½, 1};
with many ties the interval is then a little conservative (such values vary less than 0/1 outcomes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from rlhfkit.judges.base import TIE

Z_95 = 1.959963984540054  # the two-sided 95% quantile of the standard normal


class WinRate(NamedTuple):
    """A win rate and its 95% interval, all in [0, 1]; unpacks as `(rate, low, high)`."""

    rate: float
    low: float
    high: float


def wilson_interval(p: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a proportion `p` observed on `n` trials."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be in [0, 1], got {p}")
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def win_rate(judgements: Sequence[int], model_index: int = 1) -> WinRate:
    """How often the model's completion won, from a pairwise judge's results.

    `judgements`: one per prompt, the index of the better completion or -1 for a tie, as
    `BasePairwiseJudge.judge` returns them. `model_index`: where the model's completion sits in each pair;
    1 by default, as in TRL's `judge_tldr.py` (pairs are `[reference, model]`). Ties count half.
    """
    if model_index not in (0, 1):
        raise ValueError(f"model_index must be 0 or 1, got {model_index!r}")
    judgements = list(judgements)
    if not judgements:
        raise ValueError("judgements is empty: judge at least one pair")
    bad = sorted({j for j in judgements if j not in (0, 1, TIE)})
    if bad:
        raise ValueError(f"judgements must be 0, 1 or -1 (tie), got {bad}")
    wins = sum(j == model_index for j in judgements)
    ties = sum(j == TIE for j in judgements)
    rate = (wins + 0.5 * ties) / len(judgements)
    return WinRate(rate, *wilson_interval(rate, len(judgements)))
