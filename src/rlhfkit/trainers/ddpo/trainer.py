"""DDPOTrainer: policy-gradient fine-tuning of a diffusion model on an image reward (Black et al. 2023).

Each epoch: sample images with a stochastic DDIM sampler, recording every latent and the
log-probability of every denoising step; score the images; turn scores into advantages (per batch,
or per prompt from a running history); then take PPO-style clipped steps on the log-probability of
each recorded denoising step under the current model. The maths lives in `rlhfkit.core.diffusion`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlhfkit.core.diffusion import PerPromptStatTracker, classifier_free_guidance
from rlhfkit.core.losses import ppo_policy_loss
from rlhfkit.core.masking import masked_whiten
from rlhfkit.core.rewards import clip_tensor
from rlhfkit.models.sd_pipeline import DDPOStableDiffusionPipeline
from rlhfkit.trainers.common.checkpointing import (
    WEIGHTS_FILE,
    load_training_checkpoint,
    prune_checkpoints,
    resolve_checkpoint,
    save_training_checkpoint,
)
from rlhfkit.trainers.common.guards import (
    GracefulStop,
    NonFiniteGuard,
    NonFiniteStepWarning,
    loss_scaler_active,
)
from rlhfkit.trainers.common.optimizers import fused_optimizer_kwargs
from rlhfkit.trainers.common.sharding import (
    gather_optimizer_state,
    gather_tensors,
    load_optimizer_state,
    shard_like,
)
from rlhfkit.trainers.ddpo.config import DDPOConfig

logger = logging.getLogger(__name__)

_TRAJECTORY_KEYS = ("timesteps", "latents", "next_latents", "logprobs")


def _check_arguments(
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


class DDPOTrainer:
    """Train `sd_pipeline` so that `reward_function(images, prompts, prompt_metadata)` rises.

    - `prompt_function()` returns one `(prompt, metadata)` pair per call.
    - `reward_function(images (B, 3, H, W) in [0, 1], prompts, metadata)` returns B scores, either
      alone or as `(scores, reward_metadata)`.
    - `image_samples_hook(prompt_image_data, global_step, tracker)` sees every epoch's samples:
      a list of `(images, prompts, prompt_metadata, rewards, reward_metadata)` per sampling batch.
    """

    def __init__(
        self,
        config: DDPOConfig,
        reward_function: Callable[..., Any],
        prompt_function: Callable[[], tuple[str, Any]],
        sd_pipeline: DDPOStableDiffusionPipeline,
        image_samples_hook: Callable[[Any, Any, Any], Any] | None = None,
    ):
        from accelerate import Accelerator
        from accelerate.utils import DistributedType, ProjectConfiguration, set_seed

        _check_arguments(config, reward_function, prompt_function, sd_pipeline, image_samples_hook)
        self.config = config
        self.reward_fn = reward_function
        self.prompt_fn = prompt_function
        self.sd_pipeline = sd_pipeline
        self.image_samples_callback = image_samples_hook
        self.checkpoint_dir = Path(config.logdir) / config.run_name / "checkpoints"
        if config.resume_from and not Path(config.resume_from).expanduser().exists():
            raise FileNotFoundError(
                f"resume_from={config.resume_from!r} is neither a checkpoint folder nor a folder "
                "of checkpoint-<epochs> folders"
            )
        resume_dir = resolve_checkpoint(config.resume_from) if config.resume_from else None

        # One optimiser step covers train_gradient_accumulation_steps batches x all trained timesteps.
        project_config = ProjectConfiguration(**{"project_dir": config.logdir, **config.project_kwargs})
        self.accelerator = Accelerator(
            log_with=config.log_with,
            mixed_precision=config.mixed_precision,
            project_config=project_config,
            gradient_accumulation_steps=config.train_gradient_accumulation_steps * config.num_train_timesteps,
            **config.accelerator_kwargs,
        )
        _forget_stale_dataloaders(self.accelerator)
        self._fsdp = self.accelerator.distributed_type == DistributedType.FSDP
        if config.log_with is not None:
            scalars = {k: v for k, v in config.to_dict().items() if isinstance(v, int | float | str | bool)}
            self.accelerator.init_trackers(
                config.tracker_project_name, config=scalars, init_kwargs=config.tracker_kwargs
            )
        set_seed(config.seed, device_specific=True)
        if torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = config.allow_tf32

        # Frozen parts run in the mixed-precision dtype; trained weights stay float32.
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(
            self.accelerator.mixed_precision, torch.float32
        )
        device = self.accelerator.device
        for module, module_dtype in (
            (sd_pipeline.vae, dtype),
            (sd_pipeline.text_encoder, dtype),
            (sd_pipeline.unet, dtype if sd_pipeline.use_lora else torch.float32),
        ):
            module.to(device)
            if module.dtype != module_dtype:  # diffusers warns on every dtype cast, even a no-op one
                module.to(module_dtype)
        params = sd_pipeline.trainable_parameters()
        if not params:
            raise ValueError("sd_pipeline.trainable_parameters() is empty: nothing to train")
        for p in params:
            p.data = p.data.float()
        self.optimizer = self._make_optimizer(params)
        self.unet, self.optimizer = self.accelerator.prepare(sd_pipeline.unet, self.optimizer)
        # taken after `prepare`: FSDP replaces the UNet's parameters by sharded ones (and switches the optimizer
        # to them); the gradient check and clipping must read those
        self.trainable_params = sd_pipeline.trainable_parameters()

        with torch.no_grad():
            neg = sd_pipeline.encode_prompts([config.negative_prompts], device=device)
        self.neg_prompt_embed = neg  # (1, L, D), repeated per batch
        self.stat_tracker = (
            PerPromptStatTracker(
                config.per_prompt_stat_tracking_buffer_size, config.per_prompt_stat_tracking_min_count
            )
            if config.per_prompt_stat_tracking
            else None
        )
        self.executor = (
            ThreadPoolExecutor(max_workers=config.max_workers) if config.async_reward_computation else None
        )
        self.first_epoch, self.global_step = 0, 0
        self.log_history: list[dict[str, float]] = []
        self.nonfinite_guard = NonFiniteGuard(config.max_consecutive_nonfinite_steps)
        self.graceful_stop = GracefulStop()  # SIGINT/SIGTERM during train(): finish the epoch, save, return
        if resume_dir is not None:
            self._load_checkpoint(resume_dir)

    # --------------------------------------------------------------------------------------------
    # training loop
    # --------------------------------------------------------------------------------------------
    def train(self, epochs: int | None = None) -> None:
        """Run epochs `first_epoch .. epochs - 1` (default `config.num_epochs`), checkpointing as configured."""
        epochs = self.config.num_epochs if epochs is None else epochs
        with self.graceful_stop:
            for epoch in range(self.first_epoch, epochs):
                self.global_step = self.step(epoch, self.global_step)
                self.first_epoch = epoch + 1
                stop = self.graceful_stop.should_stop(self.accelerator)
                if (epoch + 1) % self.config.save_freq == 0 or stop:
                    self.save_checkpoint(epoch)
                if stop:
                    logger.warning("stopping after epoch %d on request; checkpoint saved", epoch)
                    break
        self.accelerator.end_training()

    def step(self, epoch: int, global_step: int) -> int:
        """One epoch: sample, score, compute advantages, train. Returns the updated global step."""
        cfg = self.config
        # 1. sample trajectories (latents and per-step log-probabilities) and their images
        samples, batches = self._generate_samples(cfg.sample_num_batches_per_epoch, cfg.sample_batch_size)
        # 2. score the images (rewards may still be computing in the thread pool)
        prompt_image_data, scores = self._collect_rewards(batches)
        # 3. log rewards and hand the images to the hook and trackers
        all_scores = self.accelerator.gather(scores.to(self.accelerator.device)).cpu()
        if not self.nonfinite_guard.check(
            step=epoch + 1, accelerator=self.accelerator, scores=all_scores, ends_bad_run=False
        ):
            self._fail_if_exhausted(epoch)
            return global_step  # no update from an epoch with NaN/inf rewards
        self._log(
            {
                "reward_mean": all_scores.mean().item(),
                "reward_std": all_scores.std(unbiased=False).item(),
                "epoch": epoch,
            },
            global_step,
        )
        self._log_images(prompt_image_data, global_step)
        # 4. advantages: normalise scores per prompt (running history) or over the whole batch
        prompts = [p for _, batch_prompts, *_ in prompt_image_data for p in batch_prompts]
        if self.stat_tracker is not None:
            advantages = self.stat_tracker.update(prompts, scores)
        else:
            advantages = masked_whiten(all_scores, None)
            rank = self.accelerator.process_index
            advantages = advantages[rank * len(scores) : (rank + 1) * len(scores)]
        samples["advantages"] = advantages.to(self.accelerator.device)
        # 5. clipped policy-gradient updates on the recorded denoising steps
        for inner_epoch in range(cfg.train_num_inner_epochs):
            global_step = self._train_inner_epoch(samples, epoch, inner_epoch, global_step)
        return global_step

    def calculate_loss(
        self,
        latents: torch.Tensor,
        timesteps: torch.Tensor,
        next_latents: torch.Tensor,
        log_probs: torch.Tensor,
        advantages: torch.Tensor,
        embeds: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Clipped DDPO loss of one denoising step for a batch of stored trajectories.

        latents, next_latents: (B, C, h, w); timesteps, log_probs (old), advantages: (B,);
        embeds: (2B, L, D) [negative; prompt] when config.train_cfg, else (B, L, D).
        Returns (loss, approxkl, clipfrac): PPO's surrogate on clamped advantages, so clipfrac is the
        fraction of samples where the clipped term set the loss.
        """
        cfg = self.config
        with self.accelerator.autocast():
            model_input = self.sd_pipeline.scheduler.scale_model_input(latents, timesteps)
            if cfg.train_cfg:
                noise_pred = self.unet(
                    torch.cat([model_input] * 2), torch.cat([timesteps] * 2), encoder_hidden_states=embeds
                ).sample
                noise_pred = classifier_free_guidance(noise_pred, cfg.sample_guidance_scale)
            else:
                noise_pred = self.unet(model_input, timesteps, encoder_hidden_states=embeds).sample
        step = self.sd_pipeline.scheduler_step(
            noise_pred.float(), timesteps, latents, cfg.sample_eta, prev_sample=next_latents
        )
        advantages = clip_tensor(advantages, cfg.train_adv_clip_max)
        out = ppo_policy_loss(step.logprobs, log_probs, advantages, None, cfg.train_clip_range)
        return out.loss, out.approxkl, out.clipfrac

    # --------------------------------------------------------------------------------------------
    # the pieces of a step
    # --------------------------------------------------------------------------------------------
    def _generate_samples(self, num_batches: int, batch_size: int) -> tuple[dict[str, torch.Tensor], list]:
        """Sample `num_batches` batches. Returns stacked trajectories and, per batch, the reward inputs."""
        cfg, pipe = self.config, self.sd_pipeline
        self.unet.eval()
        trajectories: list[dict[str, torch.Tensor]] = []
        batches = []
        for _ in range(num_batches):
            prompts, metadata = self._draw_prompts(batch_size)
            with torch.no_grad(), self.accelerator.autocast():
                embeds = pipe.encode_prompts(prompts, device=self.accelerator.device)
                neg = self.neg_prompt_embed.expand(batch_size, -1, -1)
                out = pipe(
                    prompt_embeds=embeds,
                    negative_prompt_embeds=neg,
                    num_inference_steps=cfg.sample_num_steps,
                    guidance_scale=cfg.sample_guidance_scale,
                    eta=cfg.sample_eta,
                )
            latents = torch.stack(out.latents, dim=1)  # (B, T + 1, C, h, w): x_T .. x_0
            trajectories.append(
                {
                    "prompt_embeds": embeds,
                    "negative_prompt_embeds": neg,
                    "timesteps": pipe.scheduler.timesteps.repeat(batch_size, 1),  # (B, T)
                    "latents": latents[:, :-1],
                    "next_latents": latents[:, 1:],
                    "logprobs": torch.stack(out.log_probs, dim=1),  # (B, T)
                }
            )
            images = out.images.float().cpu()
            if self.executor is not None:
                reward: Any = self.executor.submit(self.reward_fn, images, prompts, metadata)
            else:
                reward = self.reward_fn(images, prompts, metadata)
            batches.append((images, prompts, metadata, reward))
        samples = {k: torch.cat([t[k] for t in trajectories]) for k in trajectories[0]}
        return samples, batches

    def _draw_prompts(self, n: int) -> tuple[list[str], list[Any]]:
        pairs = [self.prompt_fn() for _ in range(n)]
        for pair in pairs:
            if not (isinstance(pair, tuple | list) and len(pair) == 2 and isinstance(pair[0], str)):
                raise TypeError(f"prompt_function must return a (prompt: str, metadata) pair, got {pair!r}")
        return [p for p, _ in pairs], [m for _, m in pairs]

    def _collect_rewards(self, batches: list) -> tuple[list, torch.Tensor]:
        prompt_image_data, all_scores = [], []
        for images, prompts, metadata, reward in batches:
            result = reward.result() if isinstance(reward, Future) else reward
            scores, reward_metadata = _parse_reward_output(result, len(prompts))
            prompt_image_data.append((images, prompts, metadata, scores, reward_metadata))
            all_scores.append(scores)
        return prompt_image_data, torch.cat(all_scores)

    def _train_inner_epoch(self, samples: dict, epoch: int, inner_epoch: int, global_step: int) -> int:
        cfg, acc = self.config, self.accelerator
        n, num_steps = samples["timesteps"].shape
        # shuffle trajectories, then each trajectory's timesteps independently, so every optimiser
        # step sees a mix of noise levels (and train_timestep_fraction keeps a random subset)
        perm = torch.randperm(n)
        samples = {k: v[perm.to(v.device)] for k, v in samples.items()}
        time_perm = torch.stack([torch.randperm(num_steps) for _ in range(n)])
        rows = torch.arange(n)[:, None]
        for key in _TRAJECTORY_KEYS:
            samples[key] = samples[key][rows, time_perm.to(samples[key].device)]

        self.unet.train()
        info: dict[str, list[torch.Tensor]] = {"loss": [], "approxkl": [], "clipfrac": []}
        for start in range(0, n, cfg.train_batch_size):
            batch = {k: v[start : start + cfg.train_batch_size] for k, v in samples.items()}
            if cfg.train_cfg:
                embeds = torch.cat([batch["negative_prompt_embeds"], batch["prompt_embeds"]])
            else:
                embeds = batch["prompt_embeds"]
            for j in range(cfg.num_train_timesteps):
                with acc.accumulate(self.unet):
                    loss, approxkl, clipfrac = self.calculate_loss(
                        batch["latents"][:, j],
                        batch["timesteps"][:, j],
                        batch["next_latents"][:, j],
                        batch["logprobs"][:, j],
                        batch["advantages"],
                        embeds,
                    )
                    acc.backward(loss)
                    if acc.sync_gradients:
                        # fp16 (DDPO's GPU default): the GradScaler checks the gradients and skips overflows
                        scaled = loss_scaler_active(acc)
                        grads = (
                            [] if scaled else [p.grad for p in self.trainable_params if p.grad is not None]
                        )
                        finite = self.nonfinite_guard.check(
                            step=global_step + 1, accelerator=acc, loss=loss, gradients=grads
                        )
                        if not finite:
                            self._fail_if_exhausted(epoch)
                        if finite or scaled:
                            acc.clip_grad_norm_(self.trainable_params, cfg.train_max_grad_norm)
                        else:  # no gradients: the optimizer step below leaves the weights alone
                            self.optimizer.zero_grad(set_to_none=True)
                    self.optimizer.step()
                    self.optimizer.zero_grad()
                for key, value in zip(info, (loss, approxkl, clipfrac)):
                    info[key].append(value.detach())
                if acc.sync_gradients:
                    logs = {
                        k: acc.reduce(torch.stack(v).mean(), reduction="mean").item() for k, v in info.items()
                    }
                    self._log({**logs, "epoch": epoch, "inner_epoch": inner_epoch}, global_step)
                    global_step += 1
                    info = {k: [] for k in info}
        return global_step

    def _fail_if_exhausted(self, epoch: int) -> None:
        """After too many non-finite steps in a row: save the (unchanged) weights, then raise."""
        self.nonfinite_guard.fail_if_exhausted(lambda: self.save_checkpoint(epoch))

    def _make_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        cfg = self.config
        if cfg.train_use_8bit_adam:
            import bitsandbytes as bnb

            optimizer_cls, extra = bnb.optim.AdamW8bit, {}
        else:
            optimizer_cls, extra = torch.optim.AdamW, fused_optimizer_kwargs(params)
        return optimizer_cls(
            params,
            lr=cfg.train_learning_rate,
            betas=(cfg.train_adam_beta1, cfg.train_adam_beta2),
            weight_decay=cfg.train_adam_weight_decay,
            eps=cfg.train_adam_epsilon,
            **extra,
        )

    # --------------------------------------------------------------------------------------------
    # logging
    # --------------------------------------------------------------------------------------------
    def _log(self, values: dict[str, float], step: int) -> None:
        self.log_history.append({**values, "step": step})
        self.accelerator.log(values, step=step)

    def _log_images(self, prompt_image_data: list, global_step: int) -> None:
        trackers = self.accelerator.trackers
        if self.image_samples_callback is not None:
            self.image_samples_callback(prompt_image_data, global_step, trackers[0] if trackers else None)
        if trackers and self.accelerator.is_main_process:
            images = prompt_image_data[0][0][:4]
            pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8).numpy()  # (N, 3, H, W)
            for tracker in trackers:
                if tracker.name == "tensorboard":  # other trackers take their own image types
                    tracker.log_images({"images": pixels}, step=global_step)

    # --------------------------------------------------------------------------------------------
    # checkpoints
    # --------------------------------------------------------------------------------------------
    def save_pretrained(self, save_directory: str | Path) -> None:
        """Save the trained model in diffusers format (LoRA weights or a full pipeline)."""
        if self._fsdp:  # the pipeline writes its own (here sharded) tensors; a checkpoint gathers them
            raise NotImplementedError(
                "DDPOTrainer.save_pretrained does not support a UNet sharded by FSDP yet: write a checkpoint "
                "(save_checkpoint, on every rank), resume it in one process (DDPOConfig.resume_from) and call "
                "save_pretrained there"
            )
        self.sd_pipeline.save_pretrained(save_directory)

    def save_checkpoint(self, epoch: int) -> Path:
        """Write `checkpoint-<epochs done>` (trained weights, optimiser, RNG, counters), keep the newest
        `num_checkpoint_limit`. Format, checksums and lock: `rlhfkit.trainers.common.checkpointing`. Call it on every
        rank: the main process writes, after (under FSDP) every rank has helped gather the shards, and each
        rank adds its own RNG state."""
        final = self.checkpoint_dir / f"checkpoint-{epoch + 1}"
        weights, extra = (
            self.sd_pipeline.trainable_state_dict(),
            {"epoch": epoch, "global_step": self.global_step},
        )
        if (
            self._fsdp
        ):  # whole tensors from the shards; the optimizer's too (`_checkpoint_parts` leaves it out)
            weights = gather_tensors(weights)
            extra["optimizer"] = gather_optimizer_state(self.unet, self.optimizer)
        save_training_checkpoint(final, epoch + 1, weights, self._checkpoint_parts(), extra=extra)
        if self.accelerator.is_main_process:
            prune_checkpoints(self.checkpoint_dir, self.config.num_checkpoint_limit, protect=(str(final),))
        return final

    def _load_checkpoint(self, path: Path) -> None:
        from safetensors.torch import load_file

        path, state = load_training_checkpoint(path, self._checkpoint_parts())
        weights = load_file(str(path / WEIGHTS_FILE))
        if self._fsdp:  # every rank read the whole tensors; each keeps its own shard of them
            weights = shard_like(self.sd_pipeline.trainable_state_dict(), weights)
            load_optimizer_state(self.unet, self.optimizer, state["optimizer"])
        self.sd_pipeline.load_trainable_state_dict(weights)
        self.first_epoch, self.global_step = state["epoch"] + 1, state["global_step"]
        logger.info("resumed from %s at epoch %d, global step %d", path, self.first_epoch, self.global_step)

    def _checkpoint_parts(self) -> dict[str, Any]:
        return {"optimizer": None if self._fsdp else self.optimizer, "stat_tracker": self.stat_tracker}


def _forget_stale_dataloaders(accelerator: Any) -> None:
    """Drop dataloaders that an earlier Trainer in this process left open in accelerate's shared state.

    A Trainer that stops on `max_steps` leaves its dataloader "active" with end_of_dataloader=True, and
    `accumulate()` then syncs on every call: DDPO would step the optimizer once per timestep instead of
    once per `gradient_accumulation_steps`. DDPO iterates no prepared dataloader, so none of them is ours.
    """
    state = accelerator.gradient_state
    if state.in_dataloader:
        state.dataloader_references = [None]


def _parse_reward_output(result: Any, expected: int) -> tuple[torch.Tensor, Any]:
    """Accept `scores` or `(scores, metadata)`; check there is one finite number per image."""
    metadata: Any = None
    if isinstance(result, tuple) and len(result) == 2 and not isinstance(result[0], int | float):
        result, metadata = result
    if result is None:
        raise TypeError(
            "reward_function returned None; it must return one score per image (or (scores, metadata))"
        )
    try:
        scores = torch.as_tensor(
            np.asarray(result, dtype=np.float32) if not torch.is_tensor(result) else result
        )
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"reward_function must return numbers, one per image; got {type(result).__name__}"
        ) from err
    scores = scores.detach().float().cpu()
    if scores.ndim == 2 and scores.shape[1] == 1:
        scores = scores[:, 0]
    if scores.shape != (expected,):
        raise ValueError(
            f"reward_function must return {expected} scores (one per image), got shape {tuple(scores.shape)}"
        )
    if not torch.isfinite(scores).all():  # not an error: DDPOTrainer.step skips the epoch's update
        warnings.warn(
            f"reward_function returned non-finite scores: {scores.tolist()}",
            NonFiniteStepWarning,
            stacklevel=3,
        )
    return scores, metadata
