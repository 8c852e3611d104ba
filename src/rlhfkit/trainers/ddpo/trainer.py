"""DDPOTrainer: policy-gradient fine-tuning of a diffusion model on an image reward (Black et al. 2023).

Each epoch: sample images with a stochastic DDIM sampler, recording every latent and the
log-probability of every denoising step; score the images; turn scores into advantages (per batch,
or per prompt from a running history); then take PPO-style clipped steps on the log-probability of
each recorded denoising step under the current model. The maths lives in `rlhfkit.core.diffusion`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from rlhfkit.core.diffusion import PerPromptStatTracker, classifier_free_guidance
from rlhfkit.core.losses import ppo_policy_loss
from rlhfkit.core.masking import masked_whiten
from rlhfkit.core.rewards import clip_tensor
from rlhfkit.models.sd_pipeline import DDPOStableDiffusionPipeline
from rlhfkit.trainers.common.checkpointing import resolve_checkpoint
from rlhfkit.trainers.common.guards import GracefulStop, NonFiniteGuard, loss_scaler_active
from rlhfkit.trainers.ddpo.config import DDPOConfig
from rlhfkit.trainers.ddpo.sampling import SamplingMethods
from rlhfkit.trainers.ddpo.saving import SavingMethods
from rlhfkit.trainers.ddpo.setup import check_arguments, make_accelerator, make_optimizer, place_pipeline

logger = logging.getLogger(__name__)

_TRAJECTORY_KEYS = ("timesteps", "latents", "next_latents", "logprobs")


class DDPOTrainer(SamplingMethods, SavingMethods):
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
        from accelerate.utils import DistributedType

        check_arguments(config, reward_function, prompt_function, sd_pipeline, image_samples_hook)
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
        resume_dir = (
            resolve_checkpoint(config.resume_from, config.trust_unverified_checkpoint)
            if config.resume_from
            else None
        )

        self.accelerator = make_accelerator(config)
        self._fsdp = self.accelerator.distributed_type == DistributedType.FSDP
        self.optimizer = make_optimizer(config, place_pipeline(sd_pipeline, self.accelerator))
        self.unet, self.optimizer = self.accelerator.prepare(sd_pipeline.unet, self.optimizer)
        # taken after `prepare`: FSDP replaces the UNet's parameters by sharded ones (and switches the
        # optimizer to them); the gradient check and clipping must read those
        self.trainable_params = sd_pipeline.trainable_parameters()

        with torch.no_grad():
            neg = sd_pipeline.encode_prompts([config.negative_prompts], device=self.accelerator.device)
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
        """Run epochs `first_epoch .. epochs - 1` (default `config.num_epochs`).

        A checkpoint is saved every `config.save_freq` epochs, and after the epoch a SIGINT/SIGTERM
        arrived in (then training stops).
        """
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

    # --------------------------------------------------------------------------------------------
    # the update
    # --------------------------------------------------------------------------------------------
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
                        self._check_and_clip(loss, epoch, global_step)
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

    def _check_and_clip(self, loss: torch.Tensor, epoch: int, global_step: int) -> None:
        """Before an optimizer step: clip finite gradients; drop non-finite ones, so that the step leaves
        the weights alone (and stop the run after too many such steps in a row)."""
        # fp16 (DDPO's GPU default): the GradScaler checks the gradients and skips overflows
        scaled = loss_scaler_active(self.accelerator)
        grads = [] if scaled else [p.grad for p in self.trainable_params if p.grad is not None]
        finite = self.nonfinite_guard.check(
            step=global_step + 1, accelerator=self.accelerator, loss=loss, gradients=grads
        )
        if not finite:
            self._fail_if_exhausted(epoch)
        if finite or scaled:
            self.accelerator.clip_grad_norm_(self.trainable_params, self.config.train_max_grad_norm)
        else:  # no gradients: the optimizer step leaves the weights alone
            self.optimizer.zero_grad(set_to_none=True)

    def _fail_if_exhausted(self, epoch: int) -> None:
        """After too many non-finite steps in a row: save the (unchanged) weights, then raise."""
        self.nonfinite_guard.fail_if_exhausted(lambda: self.save_checkpoint(epoch))

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
