"""GRPOTrainer under 2 processes (gloo; DDP and FSDP2): one update equals that of 1 process on the doubled
batch for the step-normalised loss types, replicas stay identical, and reward statistics are gathered across
ranks."""

import pytest
import torch
from launch import launch
from workers.grpo_fixtures import LOSS_TYPES, flat_params, grpo_trainer, synthetic_grpo_rollout

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("setting", ["ddp", "fsdp2"])
def test_grpo_two_processes_equal_one_process_with_the_doubled_batch(setting, tmp_path):
    r0, r1 = launch("grpo_worker.py", *(["--fsdp"] if setting == "fsdp2" else []))
    assert r0["world"] == 2
    assert r0["sharded"] == r1["sharded"] == (setting == "fsdp2")
    start = flat_params(grpo_trainer(str(tmp_path), per_device=4).model)
    for loss_type in LOSS_TYPES:
        ref = grpo_trainer(
            str(tmp_path), per_device=4, loss_type=loss_type, beta=0.1 if loss_type == "dapo" else 0.0
        )
        ref.create_optimizer_and_scheduler(num_training_steps=1)
        stats = ref._optimize(ref.model, synthetic_grpo_rollout(ref.model))
        expected = flat_params(ref.model)
        assert (expected - start).abs().max() > 1e-3, loss_type  # the step is big enough to compare
        assert r0["step_params"][loss_type] == r1["step_params"][loss_type]
        torch.testing.assert_close(
            torch.tensor(r0["step_params"][loss_type]),
            expected,
            rtol=0,
            atol=1e-6,
            msg=f"{loss_type}: 2 processes differ from 1",
        )
        # the logged loss is the step's loss, the same whether its rows sit on one process or two
        assert r0["step_loss"][loss_type] == pytest.approx(stats["loss"], abs=1e-6)
    assert r0["max_rank_diff"] == 0.0
    scores = r0["local_scores"] + r1["local_scores"]
    assert r0["reward_metric"] == r1["reward_metric"] == pytest.approx(sum(scores) / len(scores), abs=1e-5)
    assert r0["prompt_batches"] == r1["prompt_batches"] >= 1
