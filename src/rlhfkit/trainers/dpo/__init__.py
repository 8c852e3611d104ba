"""Direct preference optimisation (Rafailov et al. 2023): preference pairs, no reward model, no sampling.

Where each part lives:
  trainer.py  `DPOTrainer`: set-up, the reference, the loss and its metrics, precomputed reference log-probs
  forward.py  the concatenated chosen/rejected forward pass and the sequence log-probs
  config.py   `DPOConfig`
"""

from rlhfkit.trainers.dpo.config import DPOConfig
from rlhfkit.trainers.dpo.trainer import DPOTrainer

__all__ = ["DPOConfig", "DPOTrainer"]
