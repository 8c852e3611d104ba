"""Group relative policy optimisation (Shao et al. 2024) and its loss variants (DAPO, Dr. GRPO, GSPO, ...).

Where each part lives:
  trainer.py    `GRPOTrainer`: construction, generation batches (steps 1-4) and the update
  setup.py      reward sources, prompt datasets and sampling parameters, as `__init__` prepares them
  groups.py     one sampling round's groups, DAPO's dynamic sampling, reward and completion statistics
  reporting.py  an update's statistics over micro-batches and processes; the completion tables
  config.py     `GRPOConfig`
"""

from rlhfkit.trainers.grpo.config import GRPOConfig
from rlhfkit.trainers.grpo.trainer import GRPOTrainer

__all__ = ["GRPOConfig", "GRPOTrainer"]
