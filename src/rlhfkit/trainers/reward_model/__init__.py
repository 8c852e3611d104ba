"""Reward modelling: a scalar scorer fitted to preference pairs with the Bradley-Terry loss."""

from rlhfkit.trainers.reward_model.config import RewardConfig
from rlhfkit.trainers.reward_model.trainer import RewardTrainer

__all__ = ["RewardConfig", "RewardTrainer"]
