"""Denoising diffusion policy optimisation (Black et al. 2023): RL for diffusion models on an image reward."""

from rlhfkit.trainers.ddpo.config import DDPOConfig
from rlhfkit.trainers.ddpo.trainer import DDPOTrainer

__all__ = ["DDPOConfig", "DDPOTrainer"]
