"""Kahneman-Tversky optimisation (Ethayarajh et al. 2024): unpaired completions labelled desirable or not.

Where each part lives:
  trainer.py  `KTOTrainer`: set-up, the reference, the loss and its metrics, precomputed reference log-probs
  config.py   `KTOConfig`
The losses are in `rlhfkit.core.kto`, the data preparation and collator in `rlhfkit.data.unpaired`, the
forward passes are DPO's (`rlhfkit.trainers.dpo.forward`).
"""

from rlhfkit.trainers.kto.config import KTOConfig
from rlhfkit.trainers.kto.trainer import KTOTrainer

__all__ = ["KTOConfig", "KTOTrainer"]
