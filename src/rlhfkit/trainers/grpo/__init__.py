"""Group relative policy optimisation (Shao et al. 2024) and its loss variants (DAPO, Dr. GRPO, GSPO, ...)."""

from rlhfkit.trainers.grpo.config import GRPOConfig
from rlhfkit.trainers.grpo.trainer import GRPOTrainer

__all__ = ["GRPOConfig", "GRPOTrainer"]
