"""What GRPOTrainer offers TRL 1.x's users beyond training: its public helpers and attributes, and the
extra keywords reward functions receive.

The maths lives in `core` (`core.entropy.entropy_mask`, `core.off_policy.off_policy_sequence_mask`); the
helpers here only give it TRL's signatures. Reward functions get, besides the dataset's columns:
`trainer_state` (the `transformers.TrainerState`, for rewards that change over training), `log_extra(column,
values)` (one value per completion: a column of the completions table) and `log_metric(name, value)` (a
number, averaged over the calls of one generation batch and over processes, logged with the update).
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate.utils import gather_object

from rlhfkit.core.entropy import entropy_mask
from rlhfkit.core.off_policy import off_policy_sequence_mask


class TRLSurfaceMethods:
    """Mixed into `GRPOTrainer`; relies on its `args`, `accelerator`, `state`, `reference`, `entropy_control`
    and `_pending_reward_logs` (set up in `_setup_rollout`)."""

    def get_high_entropy_mask(
        self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float
    ) -> torch.Tensor:
        """(N, T) bool: the tokens of `mask` whose entropy is at least the `threshold` quantile of every
        process's masked entropies (threshold 0.8 keeps the top 20%; TRL's `1 - top_entropy_quantile`)."""
        local = entropies.detach()[mask.bool()].float()
        sentinel = -1.0  # entropies are never negative: marks the padding of a shorter process's share
        padded = self.accelerator.pad_across_processes(local, dim=0, pad_index=sentinel)
        pooled = self.accelerator.gather(padded)
        return entropy_mask(entropies, mask, 1.0 - threshold, pooled=pooled[pooled != sentinel])

    @staticmethod
    def get_off_policy_mask(
        advantages: torch.Tensor,
        per_token_logps: torch.Tensor,
        sampling_per_token_logps: torch.Tensor,
        mask: torch.Tensor,
        off_policy_threshold: float,
    ) -> torch.Tensor:
        """(N, 1) in `mask`'s dtype, 1 = keep: DeepSeek-V3.2's off-policy sequence mask
        (`core.off_policy.off_policy_sequence_mask`) for advantages of shape (N,) or (N, 1)."""
        keep = off_policy_sequence_mask(
            advantages.reshape(-1), per_token_logps, sampling_per_token_logps, mask, off_policy_threshold
        )
        return keep[:, None].to(mask.dtype)

    def _off_policy_mask(self, logprobs: torch.Tensor, rows: Any) -> torch.Tensor | None:
        """(N,) keep-mask of `off_policy_mask_threshold` (None when off): the drift is measured from the
        sampling logprobs, so it sees both earlier updates and any sampling/training engine gap."""
        threshold = self.args.off_policy_mask_threshold
        if threshold is None:
            return None
        keep = self.get_off_policy_mask(rows.advantages, logprobs, rows.logprobs, rows.loss_mask, threshold)
        return keep[:, 0].bool()

    @property
    def ref_model(self) -> torch.nn.Module | None:
        """The frozen reference network; None with beta = 0 or when a PEFT policy's base is the reference."""
        reference = getattr(self, "reference", None)
        return None if reference is None else reference.model

    @property
    def entropy_coef(self) -> float:
        """The entropy bonus coefficient in force (moves with `use_adaptive_entropy`)."""
        return self.entropy_control.coef

    # ------------------------------------------------------------------ reward functions' extra keywords
    def _reward_extras(self) -> dict[str, Any]:
        """The keywords every reward function receives besides the dataset's columns."""
        columns, metrics = self._pending_reward_logs
        return {
            "trainer_state": self.state,
            "log_extra": lambda column, values: columns[str(column)].extend(values),
            "log_metric": lambda name, value: metrics[str(name)].append(float(value)),
        }

    def _flush_reward_logs(self) -> tuple[dict[str, list], dict[str, float]]:
        """(this process's extra completion columns, the metrics averaged over every process) that reward
        functions logged since the last flush; names are sorted so every process gathers in one order."""
        columns, metrics = self._pending_reward_logs
        means = {}
        for name in sorted(set(gather_object(list(metrics)))):
            values = metrics.get(name, [])
            local = torch.tensor(
                [[sum(values), len(values)]], dtype=torch.float64, device=self.accelerator.device
            )
            total, count = self.accelerator.gather(local).sum(0).tolist()
            means[name] = total / count if count else float("nan")
        extra = {name: list(values) for name, values in columns.items()}
        columns.clear()
        metrics.clear()
        return extra, means
