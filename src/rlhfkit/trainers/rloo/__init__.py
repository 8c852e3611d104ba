"""REINFORCE leave-one-out (Ahmadian et al. 2024): k completions per prompt, each against the others' mean."""

from rlhfkit.trainers.rloo.config import RLOOConfig
from rlhfkit.trainers.rloo.trainer import RLOOTrainer

__all__ = ["RLOOConfig", "RLOOTrainer"]
