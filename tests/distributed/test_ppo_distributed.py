"""PPOTrainer under 2 processes (gloo), with DDP and with FSDP2: the update from half a rollout per rank
equals one process on all of it, (gathered) parameters are identical on both ranks after `step()`, step
statistics are gathered across ranks, and a sharded policy generates what an unsharded one does."""

import pytest
import torch
from launch import launch
from workers.rl_fixtures import fixed_ppo_batch, flat_trainable, ppo_trainer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["ddp", "fsdp2"])
def two_process_results(request):
    r0, r1 = launch("ppo_worker.py", *(["--fsdp"] if request.param == "fsdp2" else []))
    return request.param, r0, r1


def test_ppo_two_processes(two_process_results):
    setting, r0, r1 = two_process_results
    assert r0["world"] == 2
    # under FSDP2 each rank held only a shard; the parameters compared below were gathered whole
    assert r0["sharded"] == r1["sharded"] == (setting == "fsdp2")
    assert (r0["fsdp_units"] > 2) == (setting == "fsdp2")  # the root and each of the 2 decoder layers
    assert r0["distributed_type"] == (
        "DistributedType.FSDP" if setting == "fsdp2" else "DistributedType.MULTI_CPU"
    )
    ref = ppo_trainer(batch_size=4, max_grad_norm=0.05)
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


def test_ppo_generates_with_a_sharded_policy(two_process_results):
    """Greedy completions of the FSDP2-sharded policy equal those of an unsharded copy of its weights,
    before the first step and after it (the weights are gathered for generation and re-sharded after),
    whether all layers are gathered at once or each on use."""
    setting, *results = two_process_results
    if setting != "fsdp2":
        pytest.skip("generation is unchanged under DDP")
    trainer = ppo_trainer(batch_size=2)
    start = flat_trainable(trainer.model)
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    for rank, r in enumerate(results):
        prompts = [torch.tensor([5 + rank, 17, 42]), torch.tensor([60, 61 + rank])]
        for key, weights in (("greedy_start", start), ("greedy_end", torch.tensor(r["step_params"]))):
            torch.nn.utils.vector_to_parameters(weights, params)
            assert r[key] == [
                o.tolist() for o in trainer.generate(prompts, max_new_tokens=4, do_sample=False)
            ]
        assert r["greedy_end_per_layer"] == r["greedy_end"]  # ds3_gather_for_generation=False


def test_ppo_refuses_fsdp1(monkeypatch):
    """FSDP1 hides the root's weights behind a wrapper that generation and rollout forwards bypass:
    refused."""
    import accelerate
    from accelerate.utils import DistributedType

    class FSDP1Accelerator(accelerate.Accelerator):
        distributed_type = property(lambda self: DistributedType.FSDP)
        is_fsdp2 = property(lambda self: False)

    monkeypatch.setattr(accelerate, "Accelerator", FSDP1Accelerator)
    with pytest.raises(ValueError, match="fsdp_version: 2"):
        ppo_trainer(batch_size=2)
