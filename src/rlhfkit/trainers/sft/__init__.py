"""Supervised fine-tuning: next-token cross-entropy on text, prompt/completion or chat data, with packing."""

from rlhfkit.trainers.sft.config import SFTConfig
from rlhfkit.trainers.sft.trainer import SFTTrainer

__all__ = ["SFTConfig", "SFTTrainer"]
