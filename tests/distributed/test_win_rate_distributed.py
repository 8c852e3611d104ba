"""WinRateCallback under 2 processes (gloo, DDP): the main process alone samples, judges, logs and saves."""

import pytest
from launch import launch

pytestmark = pytest.mark.slow


def test_only_the_main_process_judges_and_training_stays_in_step():
    r0, r1 = launch("win_rate_worker.py")
    assert [step for step, _ in r0["win_rates"]] == [1, 2] and all(
        0 <= rate <= 1 for _, rate in r0["win_rates"]
    )
    assert r0["pair_steps"] == [1] * 4 + [2] * 4
    assert r1["win_rates"] == [] and r1["pair_steps"] == []
    assert r0["max_rank_diff"] == 0.0 and r0["finite"]
