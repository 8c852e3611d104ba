"""Denoising diffusion policy optimisation (Black et al. 2023): RL for diffusion models on an image reward.

Where each part lives:
  trainer.py   `DDPOTrainer`: construction, the epoch (`step`), the loss and the update
  setup.py     what `__init__` assembles: argument checks, Accelerator, pipeline placement, optimizer
  sampling.py  trajectories of the DDIM sampler, and the checked scores of their images
  saving.py    save_pretrained and resumable checkpoints
  config.py    `DDPOConfig`
"""

from rlhfkit.trainers.ddpo.config import DDPOConfig
from rlhfkit.trainers.ddpo.trainer import DDPOTrainer

__all__ = ["DDPOConfig", "DDPOTrainer"]
