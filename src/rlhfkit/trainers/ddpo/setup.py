"""How DDPOTrainer sets itself up: argument checks, the Accelerator, the pipeline's placement, the optimizer.

The frozen parts of the pipeline (VAE, text encoder, and the UNet under LoRA) run in the mixed-precision
dtype; the trained weights stay float32.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from rlhfkit.models.sd_pipeline import DDPOStableDiffusionPipeline
from rlhfkit.trainers.common.optimizers import fused_optimizer_kwargs
from rlhfkit.trainers.ddpo.config import DDPOConfig


def check_arguments(
    config: Any, reward_function: Any, prompt_function: Any, sd_pipeline: Any, hook: Any
) -> None:
    """Errors naming the argument, before the accelerator or any weight moves."""
    if not isinstance(config, DDPOConfig):
        raise TypeError(f"config must be a DDPOConfig, got {type(config).__name__}")
    for name, fn in (("reward_function", reward_function), ("prompt_function", prompt_function)):
        if not callable(fn):
            raise TypeError(f"{name} must be callable, got {type(fn).__name__}")
    if hook is not None and not callable(hook):
        raise TypeError(f"image_samples_hook must be callable or None, got {type(hook).__name__}")
    if not isinstance(sd_pipeline, DDPOStableDiffusionPipeline):
        raise TypeError(
            f"sd_pipeline must be a DDPOStableDiffusionPipeline, got {type(sd_pipeline).__name__}"
        )
    if config.train_use_lora != sd_pipeline.use_lora:
        warnings.warn(
            f"config.train_use_lora={config.train_use_lora} but the pipeline was built with "
            f"use_lora={sd_pipeline.use_lora}; the pipeline decides",
            stacklevel=3,
        )


def make_accelerator(config: DDPOConfig) -> Any:
    """The run's Accelerator, with its trackers started, every process seeded and TF32 as configured.

    One optimiser step covers train_gradient_accumulation_steps batches x all trained timesteps.
    """
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed

    project_config = ProjectConfiguration(**{"project_dir": config.logdir, **config.project_kwargs})
    accelerator = Accelerator(
        log_with=config.log_with,
        mixed_precision=config.mixed_precision,
        project_config=project_config,
        gradient_accumulation_steps=config.train_gradient_accumulation_steps * config.num_train_timesteps,
        **config.accelerator_kwargs,
    )
    forget_stale_dataloaders(accelerator)
    if config.log_with is not None:
        scalars = {k: v for k, v in config.to_dict().items() if isinstance(v, int | float | str | bool)}
        accelerator.init_trackers(
            config.tracker_project_name, config=scalars, init_kwargs=config.tracker_kwargs
        )
    set_seed(config.seed, device_specific=True)
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = config.allow_tf32
    return accelerator


def forget_stale_dataloaders(accelerator: Any) -> None:
    """Drop dataloaders that an earlier Trainer in this process left open in accelerate's shared state.

    A Trainer that stops on `max_steps` leaves its dataloader "active" with end_of_dataloader=True, and
    `accumulate()` then syncs on every call: DDPO would step the optimizer once per timestep instead of
    once per `gradient_accumulation_steps`. DDPO iterates no prepared dataloader, so none of them is ours.
    """
    state = accelerator.gradient_state
    if state.in_dataloader:
        state.dataloader_references = [None]


def place_pipeline(sd_pipeline: DDPOStableDiffusionPipeline, accelerator: Any) -> list[torch.nn.Parameter]:
    """Move the pipeline to the accelerator's device; return its trainable parameters, in float32.

    Frozen parts run in the mixed-precision dtype; trained weights stay float32.
    """
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(accelerator.mixed_precision, torch.float32)
    for module, module_dtype in (
        (sd_pipeline.vae, dtype),
        (sd_pipeline.text_encoder, dtype),
        (sd_pipeline.unet, dtype if sd_pipeline.use_lora else torch.float32),
    ):
        module.to(accelerator.device)
        if module.dtype != module_dtype:  # diffusers warns on every dtype cast, even a no-op one
            module.to(module_dtype)
    params = sd_pipeline.trainable_parameters()
    if not params:
        raise ValueError("sd_pipeline.trainable_parameters() is empty: nothing to train")
    for p in params:
        p.data = p.data.float()
    return params


def make_optimizer(config: DDPOConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """AdamW over `params` (bitsandbytes' 8-bit AdamW with `train_use_8bit_adam`)."""
    if config.train_use_8bit_adam:
        import bitsandbytes as bnb

        optimizer_cls, extra = bnb.optim.AdamW8bit, {}
    else:
        optimizer_cls, extra = torch.optim.AdamW, fused_optimizer_kwargs(params)
    return optimizer_cls(
        params,
        lr=config.train_learning_rate,
        betas=(config.train_adam_beta1, config.train_adam_beta2),
        weight_decay=config.train_adam_weight_decay,
        eps=config.train_adam_epsilon,
        **extra,
    )
