"""DDPOTrainer under 2 processes (gloo), with DDP and with FSDP2: one epoch trains the UNet's LoRA weights,
the (gathered) weights stay identical on both ranks, the gradient check and clipping see the live (under
FSDP2, sharded) parameters, not the ones the UNet had before `accelerator.prepare`, and a checkpoint written
on every rank holds the whole weights: a new run, sharded or in one process, resumes from it with them and
Adam's state, and each rank's random state: the resumed 2-process run repeats the uninterrupted one
exactly."""

import pytest
import torch
from launch import launch
from safetensors.torch import load_file

from rlhfkit.testing.diffusion import tiny_sd_pipeline_path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    path = str(tiny_sd_pipeline_path())
    runs = {}
    for setting in ("ddp", "fsdp"):
        folder = tmp_path_factory.mktemp(setting)
        runs[setting] = folder, launch("ddpo_worker.py", path, str(folder), f"--{setting}")
    return runs


@pytest.mark.parametrize("setting", ["ddp", "fsdp"])
def test_ddpo_step_two_processes(setting, results):
    _, (r0, r1) = results[setting]
    assert r0["world"] == 2
    assert r0["distributed_type"] == (
        "DistributedType.FSDP" if setting == "fsdp" else "DistributedType.MULTI_CPU"
    )
    assert r0["sharded"] == r1["sharded"] == (setting == "fsdp")
    for r in (r0, r1):
        assert r["trainable_are_live"] and r["num_trainable"] > 0
        # one optimizer step: its gradient check got every trainable gradient, and clipping measured them
        assert r["gradients"] == [r["num_trainable"]]
        assert len(r["grad_norms"]) == 1 and r["grad_norms"][0] > 0
        assert r["finite"] and r["moved"] > 1e-3
    assert r0["max_rank_diff"] == 0.0
    assert r0["grad_norms"] == r1["grad_norms"]


def test_ddpo_step_is_the_same_sharded_or_replicated(results):
    """Same seeds, same samples: sharding the UNet changes where the weights live, not the step
    (float tolerance)."""
    (_, (ddp, _)), (_, (fsdp, _)) = results["ddp"], results["fsdp"]
    assert fsdp["grad_norms"][0] == pytest.approx(ddp["grad_norms"][0], rel=1e-4)
    torch.testing.assert_close(
        torch.tensor(fsdp["params"]), torch.tensor(ddp["params"]), rtol=1e-4, atol=1e-6
    )


@pytest.mark.parametrize("setting", ["ddp", "fsdp"])
def test_ddpo_checkpoint_resumes_sharded_and_in_one_process(setting, results, tmp_path):
    from rlhfkit.models.sd_pipeline import DefaultDDPOStableDiffusionPipeline
    from rlhfkit.trainers.ddpo.config import DDPOConfig
    from rlhfkit.trainers.ddpo.trainer import DDPOTrainer

    folder, (r0, r1) = results[setting]
    for r in (r0, r1):  # the 2-process run resumed from it: same weights on every rank, epoch 1 next
        assert r["resumed_equals_saved"] and r["resumed_first_epoch"] == 1
    assert r0["optimizer_restored"]
    # one process resumes from the same checkpoint: whole weights, and Adam's state of one step
    checkpoint = folder / "checkpoints" / "checkpoint-1"
    config = DDPOConfig(
        sample_num_steps=2,
        sample_batch_size=2,
        train_batch_size=2,
        mixed_precision="no",
        logdir=str(tmp_path),
        resume_from=str(checkpoint),
    )
    trainer = DDPOTrainer(
        config,
        lambda *a: [0.0, 0.0],
        lambda: ("a cat", {}),
        DefaultDDPOStableDiffusionPipeline(str(tiny_sd_pipeline_path())),
    )
    params = torch.cat([p.detach().reshape(-1) for p in trainer.trainable_params])
    assert torch.equal(params, load_file(str(folder / "gathered.safetensors"))["params"])
    adam = trainer.optimizer.state_dict()["state"]
    assert len(adam) == len(trainer.trainable_params)
    assert all(s["step"] == 1 for s in adam.values())
    assert any(
        s["exp_avg"].abs().max() > 0 for s in adam.values()
    )  # lora_A has no gradient while lora_B is 0


@pytest.mark.parametrize("setting", ["ddp", "fsdp"])
def test_ddpo_resumed_epoch_repeats_the_uninterrupted_one(setting, results):
    """Both ranks sample the same prompts: only their own random states (each restored from the checkpoint's
    `rng_state_<rank>`) make their images differ, and the resumed epoch 2 must match the uninterrupted one."""
    _, (r0, r1) = results[setting]
    assert r0["image_means"][1] != r1["image_means"][1]  # the ranks' noise differs in the uninterrupted run
    for r in (r0, r1):
        assert r["resumed_images_equal"]  # epoch 2's images, sampled again after resuming
        assert r["epoch_2_moved"] > 0 and r["resumed_minus_continued"] == 0.0
