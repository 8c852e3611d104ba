"""RLOOTrainer under 2 processes (gloo), with DDP and with FSDP2: same update as 1 process on the double
batch, (gathered) parameters stay equal on both ranks, stats are gathered across ranks, a stop request on one
rank stops all of them at the same step."""

import pytest
import torch
from launch import launch
from workers.rl_fixtures import flat_params, rloo_trainer, synthetic_rloo_rollout

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("setting", ["ddp", "fsdp2"])
def test_rloo_two_processes(setting, tmp_path):
    r0, r1 = launch("rloo_worker.py", *(["--fsdp"] if setting == "fsdp2" else []))
    assert r0["world"] == 2
    # under FSDP2 each rank held only a shard; the parameters compared below were gathered whole
    assert r0["sharded"] == r1["sharded"] == (setting == "fsdp2")
    assert r0["distributed_type"] == (
        "DistributedType.FSDP" if setting == "fsdp2" else "DistributedType.MULTI_CPU"
    )
    # A: one process on both prompts (local batch 4) makes the same SGD step as 2 ranks x 1 prompt each
    ref = rloo_trainer(str(tmp_path), per_device=4)
    ref.create_optimizer_and_scheduler(num_training_steps=1)
    stats = ref._optimize(ref.model, synthetic_rloo_rollout(ref.model))
    expected = flat_params(ref.policy)
    assert r0["step_params"] == r1["step_params"]
    start = flat_params(rloo_trainer(str(tmp_path), per_device=4).policy)
    assert (expected - start).abs().max() > 1e-3  # the step is big enough to compare
    torch.testing.assert_close(torch.tensor(r0["step_params"]), expected, rtol=0, atol=1e-6)
    # the logged loss is averaged over ranks: mean of per-rank means == full-batch mean (equal halves)
    assert r0["step_loss"] == pytest.approx(stats["loss/policy_avg"], abs=1e-6)
    # B: after two full updates the replicas are identical and training moved them
    assert r0["max_rank_diff"] == 0.0 and r0["moved"] > 0
    # gathered metric = mean over the scores of both ranks (equal local sizes)
    all_scores = r0["local_scores"] + r1["local_scores"]
    assert r0["gathered_scores_metric"] == pytest.approx(sum(all_scores) / len(all_scores), abs=1e-5)
    assert r0["gathered_scores_metric"] == r1["gathered_scores_metric"]
    # C: rank 0 alone got SIGINT during update 2 of 4; both ranks stop after it, one checkpoint
    assert r0["stopped_at"] == r1["stopped_at"] == 2
    assert r0["stopped_by_signal"] and r1["stopped_by_signal"]
    assert r0["checkpoints"] == ["checkpoint-2"]
    assert r0["checkpoint_equals_trained"] and r1["checkpoint_equals_trained"]
