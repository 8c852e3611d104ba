"""Direct preference optimisation (Rafailov et al. 2023): preference pairs, no reward model, no sampling."""

from rlhfkit.trainers.dpo.config import DPOConfig
from rlhfkit.trainers.dpo.trainer import DPOTrainer

__all__ = ["DPOConfig", "DPOTrainer"]
