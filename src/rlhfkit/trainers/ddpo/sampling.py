"""DDPO's samples: trajectories of the stochastic DDIM sampler, and the scores of their images.

Each sampling batch draws its prompts from `prompt_function`, records every latent and the log-probability
of every denoising step, and hands the images to `reward_function` (in a thread pool when rewards are
computed asynchronously). The scores are collected afterwards and checked: one finite number per image.
"""

from __future__ import annotations

import warnings
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from rlhfkit.trainers.common.guards import NonFiniteStepWarning


class SamplingMethods:
    """Mixed into `DDPOTrainer`; relies on its `config`, `accelerator`, `sd_pipeline`, `unet`,
    `neg_prompt_embed`, `prompt_fn`, `reward_fn` and `executor`."""

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
            scores, reward_metadata = parse_reward_output(result, len(prompts))
            prompt_image_data.append((images, prompts, metadata, scores, reward_metadata))
            all_scores.append(scores)
        return prompt_image_data, torch.cat(all_scores)


def parse_reward_output(result: Any, expected: int) -> tuple[torch.Tensor, Any]:
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
