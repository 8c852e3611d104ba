"""PPOTrainer under 2 processes (gloo): the update from half a rollout per rank equals one process on all of
it, replicas stay identical after `step()`, and step statistics are gathered across ranks."""

import pytest
import torch
from launch import launch
from workers.rl_fixtures import fixed_ppo_batch, flat_trainable, ppo_trainer

pytestmark = pytest.mark.slow


def test_ppo_two_processes():
    r0, r1 = launch("ppo_worker.py")
    assert r0["world"] == 2
    ref = ppo_trainer(batch_size=4)
    start = flat_trainable(ref.model)
    ref._update(fixed_ppo_batch(ref, rows=[0, 1, 2, 3]))
    expected = flat_trainable(ref.model)
    assert (expected - start).abs().max() > 1e-3  # a visible update
    assert r0["epoch_params"] == r1["epoch_params"]
    torch.testing.assert_close(torch.tensor(r0["epoch_params"]), expected, rtol=0, atol=1e-6)
    assert r0["max_rank_diff"] == 0.0
    # ranks scored (1, 2) and (11, 12): the logged mean covers all four
    assert r0["mean_scores"] == pytest.approx(6.5) and r1["mean_scores"] == pytest.approx(6.5)
    assert r0["kl"] == pytest.approx(r1["kl"])
