"""Worker: one DDPOTrainer epoch (LoRA on the tiny UNet) on 2 gloo processes; `--fsdp` shards the UNet
with FSDP2.

Argument 1 is the tiny pipeline's folder (built once by the test, not by both ranks at once), argument 2 a
folder shared by both ranks for the run's logs and checkpoints. Records the (gathered) trained parameters
before and after, and what the gradient check and clipping were given. Then `save_checkpoint` on every rank
(rank 0 also writes the gathered parameters to `<folder>/gathered.safetensors`), the run goes on for epoch 2,
and a new trainer resumes from the checkpoint and takes epoch 2 too: both ranks sample the same prompts, so
only their random states tell their images apart, and the resumed run must sample and end like the
uninterrupted one.
"""

import copy
import sys

import torch
from launch import save_result
from safetensors.torch import save_file

from rlhfkit.models.sd_pipeline import DefaultDDPOStableDiffusionPipeline
from rlhfkit.trainers.common.sharding import gather_optimizer_state
from rlhfkit.trainers.ddpo.config import DDPOConfig
from rlhfkit.trainers.ddpo.trainer import DDPOTrainer

pipeline_path, folder, fsdp = sys.argv[1], sys.argv[2], "--fsdp" in sys.argv
accelerator_kwargs = {}
if fsdp:
    from accelerate import FullyShardedDataParallelPlugin
    from fsdp_cpu import full_params, is_sharded

    accelerator_kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(fsdp_version=2)
else:
    from rl_fixtures import flat_trainable

    full_params = lambda model, trainable_only: flat_trainable(model)  # noqa: E731


sampled = []  # each epoch's images on this rank, as the reward function sees them


def reward(images, prompts, metadata):
    sampled.append(images.clone())
    return images.mean(dim=(1, 2, 3))


def ddpo_trainer(resume_from=None):
    config = DDPOConfig(
        num_epochs=1, sample_num_steps=2, sample_batch_size=2, sample_num_batches_per_epoch=1,
        train_batch_size=2, mixed_precision="no", logdir=folder, save_freq=1000, train_learning_rate=1e-2,
        seed=0, train_max_grad_norm=1e-3,
        accelerator_kwargs=accelerator_kwargs, resume_from=resume_from or "",
    )  # fmt: skip
    it = iter(["a cat", "a dog"] * 8)
    torch.manual_seed(0)  # the LoRA weights are drawn when the pipeline is built: the same on both ranks
    return DDPOTrainer(
        config,
        reward,
        lambda: (next(it), {}),
        DefaultDDPOStableDiffusionPipeline(pipeline_path),
    )


trainer = ddpo_trainer()
unet = trainer.sd_pipeline.unet
start = full_params(unet, trainable_only=True)
seen = {"gradients": [], "grad_norms": []}
check, clip = trainer.nonfinite_guard.check, trainer.accelerator.clip_grad_norm_


def recording_check(*args, **named):
    if "gradients" in named:
        seen["gradients"].append(len(named["gradients"]))
    return check(*args, **named)


def recording_clip(params, max_norm):
    norm = clip(params, max_norm)
    seen["grad_norms"].append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))
    return norm


trainer.nonfinite_guard.check, trainer.accelerator.clip_grad_norm_ = recording_check, recording_clip
trainer.global_step = trainer.step(0, 0)  # not train(): its end_training() would take down the process group
params = full_params(unet, trainable_only=True)
everyone = trainer.accelerator.gather(params[None])
live = {id(p) for p in unet.parameters() if p.requires_grad}
result = {
    "world": trainer.accelerator.num_processes,
    "distributed_type": str(trainer.accelerator.distributed_type),
    "sharded": fsdp and is_sharded(unet),
    "trainable_are_live": [id(p) for p in trainer.trainable_params] == [id(p) for p in unet.parameters()
                                                                        if p.requires_grad] and bool(live),
    "num_trainable": len(trainer.trainable_params),
    "params": params.tolist(),
    "moved": (params - start).abs().max().item(),
    "max_rank_diff": (everyone - everyone[0]).abs().max().item(),
    "finite": bool(torch.isfinite(params).all()),
    **{k: list(v) for k, v in seen.items()},  # epoch 1 only: the run goes on below
}  # fmt: skip

# save on every rank, resume in a new trainer: the same weights and (gathered) optimizer state
checkpoint = trainer.save_checkpoint(0)
saved_optimizer = copy.deepcopy(gather_optimizer_state(unet, trainer.optimizer))  # may share the live tensors
if trainer.accelerator.is_main_process:
    save_file({"params": params}, f"{folder}/gathered.safetensors")
trainer.accelerator.wait_for_everyone()
trainer.step(1, trainer.global_step)  # the uninterrupted run's epoch 2 (before the new trainer seeds afresh)
continued = full_params(unet, trainable_only=True)
resumed = ddpo_trainer(resume_from=str(checkpoint))
result["resumed_first_epoch"] = resumed.first_epoch
result["resumed_equals_saved"] = torch.equal(
    full_params(resumed.sd_pipeline.unet, trainable_only=True), params
)
loaded_optimizer = gather_optimizer_state(resumed.sd_pipeline.unet, resumed.optimizer)
if trainer.accelerator.is_main_process:  # the others get empty dicts
    pairs = [(saved_optimizer["state"][k], loaded_optimizer["state"][k]) for k in saved_optimizer["state"]]
    result["optimizer_restored"] = len(pairs) == len(resumed.trainable_params) and all(
        torch.equal(a[key], b[key]) for a, b in pairs for key in ("exp_avg", "exp_avg_sq", "step")
    )
resumed.step(resumed.first_epoch, resumed.global_step)
resumed_params = full_params(resumed.sd_pipeline.unet, trainable_only=True)
result["epoch_2_moved"] = (continued - params).abs().max().item()
result["resumed_minus_continued"] = (resumed_params - continued).abs().max().item()
result["image_means"] = [images.mean().item() for images in sampled]  # epochs 1, 2 and the resumed epoch 2
result["resumed_images_equal"] = torch.equal(sampled[2], sampled[1])
save_result(result)
