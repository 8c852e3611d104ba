"""The launcher works: 2 gloo processes train in lock-step and match one process on twice the batch."""

import pytest
import torch
from launch import launch

pytestmark = pytest.mark.slow


def test_two_processes_match_one_process_on_double_batch():
    r0, r1 = launch("plain_step.py")
    assert r0["world"] == r1["world"] == 2
    assert r0["backend"] == "gloo"
    # parameters are identical on both ranks (DDP keeps replicas in sync)
    assert r0["max_rank_diff"] == 0.0
    assert r0["params"] == r1["params"]
    # 2 processes x B rows == 1 process x 2B rows (averaged gradients; float32 sum order may differ)
    torch.testing.assert_close(
        torch.tensor(r0["params"]), torch.tensor(r0["reference_params"]), rtol=1e-5, atol=1e-6
    )
    # the mean of per-rank losses gathered across ranks is the full-batch loss
    torch.testing.assert_close(
        torch.tensor(r0["gathered_losses"]), torch.tensor(r0["reference_losses"]), rtol=1e-5, atol=1e-6
    )
    assert r0["gathered_losses"] == r1["gathered_losses"]
