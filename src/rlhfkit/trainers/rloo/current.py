"""RLOOTrainer in TRL 1.x's form: GRPO's loop with RLOO's reward, baseline and sequence-level loss.

One generation batch, as in `GRPOTrainer`: groups of `num_generations` completions per prompt, scored by the
reward functions (optionally clipped to `reward_clip_range`). Then, where they differ:
  - the KL penalty is part of the reward: each completion's reward loses `beta` times its summed k1 estimate,
    sum_t (log pi(y_t) - log pi_ref(y_t)), with the sampling logprobs as log pi (TRL runs a second policy
    pass for them; here they are streamed out of generation, as in GRPOTrainer);
  - advantages: the reward minus the mean reward of the other scored completions of its prompt
    (`core.advantages.leave_one_out_advantages`), standardised over the batch with `normalize_advantages`;
  - the loss treats a completion as one action: r = exp(sum_t log pi - sum_t log pi_old), clipped to
    [1 - epsilon, 1 + epsilon_high], loss = -min(r A, clip(r) A) averaged over the completions of the update.
Logged as TRL does: `reward` (before the KL), `kl` (mean k1 per completion token), `entropy`, `clip_ratio/*`.
"""

from __future__ import annotations

import torch
from torch import nn

from rlhfkit.core.advantages import leave_one_out_advantages
from rlhfkit.core.losses import ppo_policy_loss
from rlhfkit.core.masking import masked_mean
from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.trainers.grpo.groups import SampledGroups
from rlhfkit.trainers.grpo.trainer import GRPOTrainer
from rlhfkit.trainers.rloo.config import RLOOConfig
from rlhfkit.trainers.rloo.forms import RLOOTrainer


class GroupRLOOTrainer(RLOOTrainer, GRPOTrainer):
    """`RLOOTrainer(model, reward_funcs, args=RLOOConfig(...), train_dataset=..., processing_class=...)`.

    Takes GRPOTrainer's arguments (`model` a causal LM or a local path; `reward_funcs` callables, reward
    models or their paths; `peft_config`; `reward_processing_classes`) and RLOOConfig's current-form fields.
    """

    _tag_names = ["rlhfkit", "rloo"]
    _owner, _config_class = "RLOOTrainer", RLOOConfig

    def _settle(self, args: RLOOConfig) -> None:
        args.settle("current")

    def _sample_batch(self) -> tuple[SampledGroups, dict[str, float]]:
        return self._sample_groups(), {}  # no dynamic sampling: every group counts toward its baseline

    def _advantages(
        self,
        batch: RolloutBatch,
        scores: torch.Tensor,
        per_source: torch.Tensor | None = None,
        group_size: int | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        args, metrics = self.args, {}
        rewards = scores
        if args.reward_clip_bounds is not None:
            rewards = rewards.clamp(*args.reward_clip_bounds)  # NaN (unscored) stays NaN
        if batch.ref_logprobs is not None:  # over sampled tokens: a tool's inserted result is no action
            mask = batch.model_tokens().to(batch.logprobs.dtype)
            per_token = (batch.logprobs - batch.ref_logprobs) * mask
            kl = self.accelerator.gather(per_token.sum(1))
            rewards = rewards - args.beta * kl.to(rewards.dtype)
            totals = self.accelerator.gather(torch.stack([per_token.sum(), mask.sum()])[None]).sum(0)
            metrics["kl"] = (totals[0] / totals[1].clamp(min=1)).item()
        group_size = group_size or args.num_generations
        return leave_one_out_advantages(rewards, group_size, args.normalize_advantages), metrics

    def _loss(
        self,
        model: nn.Module,
        rows: RolloutBatch,
        step_tokens: float,
        step_sequences: int,
        training: bool = True,
    ) -> tuple[torch.Tensor, dict]:
        args, mask = self.args, rows.loss_mask
        out, old, router_losses = self._policy_logprobs(model, rows)
        weights = mask.to(out.logprobs.dtype)
        new_seq, old_seq = (out.logprobs * weights).sum(1), (old * weights).sum(1)
        epsilon_high = args.epsilon if args.epsilon_high is None else args.epsilon_high
        result = ppo_policy_loss(new_seq, old_seq, rows.advantages, None, args.epsilon, epsilon_high)
        # the mean over every completion of the update (all micro-batches), as one batch would give
        share = len(rows) / step_sequences
        loss, router_metrics = self.router_aux.add(result.loss * share, router_losses, scale=share)
        with torch.no_grad():
            ratio = torch.exp(new_seq - old_seq)
            low = ((ratio < 1 - args.epsilon) & (rows.advantages < 0)).float().mean()
            high = ((ratio > 1 + epsilon_high) & (rows.advantages > 0)).float().mean()
            stats = {
                "loss": result.loss.detach(),
                "entropy": masked_mean(out.entropy, rows.model_tokens()),
                "clip_ratio/low_mean": low,
                "clip_ratio/high_mean": high,
                "clip_ratio/region_mean": low + high,
                **router_metrics,
            }
        return loss, {**stats, **self._sampling_gap(out.logprobs, rows)}

    def _model_card_lines(self) -> list[str]:
        args = self.args
        return [
            "REINFORCE leave-one-out (RLOO), TRL 1.x's form",
            f"- completions per prompt (num_generations): {args.num_generations}",
            f"- beta: {args.beta}, normalize_advantages: {args.normalize_advantages}, "
            f"reward functions: {', '.join(self.reward_func_names)}",
            f"- updates: {self.state.global_step}",
            f"- completions trained on: {self.state.global_step * self._episodes_per_update()}",
            "",
            "RLOO: Ahmadian et al., *Back to Basics: Revisiting REINFORCE Style Optimization for Learning "
            "from Human Feedback in LLMs*, 2024 (arXiv:2402.14740).",
        ]
