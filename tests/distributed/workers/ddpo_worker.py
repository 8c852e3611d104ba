"""Worker: one DDPOTrainer epoch (LoRA on the tiny UNet) on 2 gloo processes; `--fsdp` shards the UNet with FSDP2.

Argument 1 is the tiny pipeline's folder (built once by the test, not by both ranks at once), argument 2 a
folder shared by both ranks for the run's logs and checkpoints. Records the (gathered) trained parameters before
and after, and what the gradient check and clipping were given. Then `save_checkpoint` on every rank (rank 0
also writes the gathered parameters to `<folder>/gathered.safetensors`), and a new trainer resumes from it.
"""

import sys

import torch
from launch import save_result
from safetensors.torch import save_file

from rlhfkit.models.sd_pipeline import DefaultDDPOStableDiffusionPipeline
from rlhfkit.trainers.ddpo import DDPOTrainer
from rlhfkit.trainers.ddpo_config import DDPOConfig
from rlhfkit.trainers.sharded_state import gather_optimizer_state

pipeline_path, folder, fsdp = sys.argv[1], sys.argv[2], "--fsdp" in sys.argv
accelerator_kwargs = {}
if fsdp:
    from accelerate import FullyShardedDataParallelPlugin
    from fsdp_cpu import full_params, is_sharded

    accelerator_kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(fsdp_version=2)
else:
    from rl_fixtures import flat_trainable

    full_params = lambda model, trainable_only: flat_trainable(model)  # noqa: E731


def ddpo_trainer(resume_from=None):
    config = DDPOConfig(
        num_epochs=1, sample_num_steps=2, sample_batch_size=2, sample_num_batches_per_epoch=1, train_batch_size=2,
        mixed_precision="no", logdir=folder, save_freq=1000, train_learning_rate=1e-2, seed=0,
        train_max_grad_norm=1e-3, accelerator_kwargs=accelerator_kwargs, resume_from=resume_from or "",
    )  # fmt: skip
    it = iter(["a cat", "a dog"] * 8)
    torch.manual_seed(0)  # the LoRA weights are drawn when the pipeline is built: the same on both ranks
    return DDPOTrainer(
        config, lambda images, prompts, metadata: images.mean(dim=(1, 2, 3)), lambda: (next(it), {}),
        DefaultDDPOStableDiffusionPipeline(pipeline_path),
    )  # fmt: skip


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
trainer.step(0, 0)  # not train(): its end_training() would take down the process group
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
    **seen,
}  # fmt: skip

# save on every rank, resume in a new trainer: the same weights and (gathered) optimizer state
checkpoint = trainer.save_checkpoint(0)
saved_optimizer = gather_optimizer_state(unet, trainer.optimizer)
if trainer.accelerator.is_main_process:
    save_file({"params": params}, f"{folder}/gathered.safetensors")
trainer.accelerator.wait_for_everyone()
resumed = ddpo_trainer(resume_from=str(checkpoint))
result["resumed_first_epoch"] = resumed.first_epoch
result["resumed_equals_saved"] = torch.equal(full_params(resumed.sd_pipeline.unet, trainable_only=True), params)
loaded_optimizer = gather_optimizer_state(resumed.sd_pipeline.unet, resumed.optimizer)
if trainer.accelerator.is_main_process:  # the others get empty dicts
    pairs = [(saved_optimizer["state"][k], loaded_optimizer["state"][k]) for k in saved_optimizer["state"]]
    result["optimizer_restored"] = len(pairs) == len(resumed.trainable_params) and all(
        torch.equal(a[key], b[key]) for a, b in pairs for key in ("exp_avg", "exp_avg_sq", "step")
    )
save_result(result)
