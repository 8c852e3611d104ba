"""`PPOTrainer`'s statistics API (TRL's names): the step statistics as tensors, their reduction across
processes, and `log_stats`, which sends them with a reward summary to the trackers (`config.log_with`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from rlhfkit.trainers.common.health import watch_judge
from rlhfkit.trainers.ppo import stats as ppo_stats


class TrackingMethods:
    """Mixed into `PPOTrainer`; relies on its `accelerator`, `current_device`, `current_step`, `health`."""

    def record_step_stats(self, kl_coef: float, **data: Any) -> dict[str, torch.Tensor]:
        """The step statistics (objective/*, ppo/*, tokens/*) as tensors; see `ppo_stats.summarize_step`."""
        return ppo_stats.summarize_step(kl_coef=kl_coef, **data)

    def gather_stats(self, stats: dict[str, Any]) -> dict[str, Any]:
        """Average scalar stats over processes and concatenate distributions; identity in one process."""
        if self.accelerator.num_processes == 1:
            return stats
        return ppo_stats.gather_across_processes(self.accelerator, stats, self.current_device)

    def log_stats(
        self,
        stats: dict[str, Any],
        batch: dict[str, Any],
        rewards: Any,
        columns_to_log: tuple[str, ...] | list[str] = ("query", "response"),
    ) -> dict[str, Any]:
        """Send the step statistics and reward summary to the trackers (`config.log_with`).

        Adds env/reward_mean, env/reward_std, env/reward_dist; returns the logged dict. With wandb, a
        table of the `columns_to_log` texts and their rewards is logged too.
        """
        rewards = ppo_stats.as_score_tensor(rewards).to(self.current_device)
        if self.accelerator.num_processes > 1:
            rewards = self.accelerator.gather(rewards)
        logs = {**stats, **ppo_stats.reward_summary(rewards)}
        logs.update(watch_judge(self.health, logs, self.current_step, self.accelerator.is_main_process))
        if self.accelerator.is_main_process and self.accelerator.trackers:
            self.accelerator.log(ppo_stats.tracker_scalars(logs), step=self.current_step)
            with contextlib.suppress(ValueError, ImportError):  # a table of samples, for wandb only
                table = ppo_stats.wandb_table(batch, rewards, list(columns_to_log))
                if table is not None:
                    wandb_tracker = self.accelerator.get_tracker("wandb", unwrap=True)
                    wandb_tracker.log({"game_log": table}, step=self.current_step)
        return logs
