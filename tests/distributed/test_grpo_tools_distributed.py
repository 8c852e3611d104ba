"""GRPOTrainer with tools under 2 processes (gloo, DDP): multi-turn episodes with tool tokens in the
sequence train exactly as one process on the doubled batch, and the `tools/*` metrics are gathered over
both ranks' episodes."""

import pytest
import torch
from launch import launch
from workers.grpo_tools_fixtures import flat_params, grpo_tools_trainer, tool_metrics

pytestmark = pytest.mark.slow


def test_grpo_with_tools_on_two_processes_equals_one_process_on_the_doubled_batch(tmp_path):
    r0, r1 = launch("grpo_tools_worker.py", timeout=600)
    assert r0["world"] == 2
    assert r0["max_rank_diff"] == 0.0
    ref = grpo_tools_trainer(str(tmp_path), per_device=8, calls=lambda i: i % 2 == 0)
    start = flat_params(ref.model).clone()
    ref.train()
    expected = flat_params(ref.model)
    assert (expected - start).abs().max() > 1e-3  # the update is big enough to compare
    torch.testing.assert_close(torch.tensor(r0["params"]), expected, rtol=0, atol=1e-6)
    # A: half of every rank's rows call the tool once, as in the one-process run
    one_process = tool_metrics(ref)
    assert r0["metrics_a"] == r1["metrics_a"] == pytest.approx(one_process)
    assert one_process["tools/call_frequency"] == pytest.approx(0.5)
    assert one_process["tools/failure_frequency"] == 0.0
    assert one_process["tools/turns_mean"] == pytest.approx(1.5)  # callers: 2 turns, the others: 1
    inserted_per_call = one_process["tools/inserted_tokens_mean"] / 0.5
    assert inserted_per_call > 0
    # B: rank 0 calls on 4 rows of 4, rank 1 on 2 of 4: 6 calls over 8 episodes on both ranks' logs
    assert r0["metrics_b"] == r1["metrics_b"]
    assert r0["metrics_b"]["tools/call_frequency"] == pytest.approx(0.75)
    assert r0["metrics_b"]["tools/turns_mean"] == pytest.approx(1.75)
    assert r0["metrics_b"]["tools/inserted_tokens_mean"] == pytest.approx(0.75 * inserted_per_call)
