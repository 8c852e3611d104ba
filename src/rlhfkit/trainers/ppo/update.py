"""Step 4 of PPO: `ppo_epochs` passes of clipped policy and value losses over shuffled minibatches.

Each pass shuffles the batch, splits it into accumulation groups of `local_backward_batch_size` rows
and each group into minibatches of `local_mini_batch_size`. A minibatch's loss is weighted by its share
of the group's trained tokens, so the summed gradient is that of the token-mean loss over the group,
however it is split (8 x 1 and 1 x 8 give the same update). Departures from TRL 0.7: a minibatch whose
mean ratio exceeds `ratio_threshold` gets no backward at all (TRL zeroes its loss after the backward),
and with `early_stopping` the group that drifted past 1.5 x `target_kl` is dropped, not applied.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rlhfkit.core.logprobs import entropy_from_logits
from rlhfkit.core.losses import ppo_policy_loss, ppo_value_loss
from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.rollout.scoring import ForwardOutput
from rlhfkit.trainers.ppo import stats as ppo_stats

logger = logging.getLogger(__name__)


def minibatch_loss(
    config: Any,
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    vpreds: torch.Tensor,
    values: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    logits: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(policy loss, vf_coef * value loss, statistics) of one minibatch; every tensor (b, R).

    `logits` (b, R, V) or `entropy` (b, R) feed only the entropy statistic (no graph through them).
    """
    policy = ppo_policy_loss(logprobs, old_logprobs, advantages, mask, config.cliprange)
    value = ppo_value_loss(vpreds, values, returns, mask, config.cliprange_value)
    if entropy is None and logits is not None:
        if logits.dim() != mask.dim() + 1 or logits.shape[:-1] != mask.shape:
            raise ValueError(
                f"logits must be (b, R, vocab) over the mask's (b, R) = {tuple(mask.shape)} tokens, "
                f"got shape {tuple(logits.shape)}; pass logits=None to skip the entropy statistic"
            )
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach())
    stats = ppo_stats.minibatch_loss_stats(
        pg_loss=policy.loss,
        vf_loss=value.loss,
        vf_coef=config.vf_coef,
        policy=policy,
        value=value,
        entropy=entropy,
        vpreds=vpreds,
        old_logprobs=old_logprobs,
        logprobs=logprobs,
        advantages=advantages,
        returns=returns,
        mask=mask,
    )
    return policy.loss, config.vf_coef * value.loss, stats


@dataclass
class UpdateResult:
    """What the PPO epochs did: per-minibatch statistics, whether KL stopped them, optimizer steps taken."""

    minibatch_stats: list[dict[str, torch.Tensor]] = field(default_factory=list)
    early_stopped: bool = False
    optimizer_steps: int = 0


def run_ppo_epochs(
    batch: RolloutBatch,
    config: Any,
    *,
    forward: Callable[[RolloutBatch], ForwardOutput],
    backward: Callable[[torch.Tensor], None],
    optimizer_step: Callable[[], None],
    zero_grad: Callable[[], None],
    any_process: Callable[[bool], bool],
) -> UpdateResult:
    """The update of one PPO step over `batch` (logprobs, values, advantages and returns filled in).

    `forward(rows)` runs the policy with gradient (values and logits); `any_process(flag)` makes every
    process take the same branch; `optimizer_step()` applies (and zeroes) the accumulated gradients.
    """
    result = UpdateResult()
    rows_total = len(batch)
    for _ in range(config.ppo_epochs):
        order = torch.randperm(rows_total).to(batch.query_ids.device)
        for start in range(0, rows_total, config.local_backward_batch_size):
            group = order[start : start + config.local_backward_batch_size]
            group_tokens = batch.loss_mask[group].sum().clamp(min=1)
            contributed = False
            for idx, mb in batch.minibatches(config.local_mini_batch_size, group):
                out = forward(mb)
                pg_loss, vf_loss, stats = minibatch_loss(
                    config, logprobs=out.logprobs, old_logprobs=mb.logprobs, vpreds=out.values,
                    values=mb.values, advantages=mb.advantages, returns=mb.returns, mask=mb.loss_mask,
                    logits=out.logits, entropy=out.entropy,
                )  # fmt: skip
                skip = any_process(bool(stats["policy/ratio_mean"] > config.ratio_threshold))
                stats["policy/skipped"] = torch.tensor(float(skip))
                if skip:
                    logger.warning(
                        "PPO: skipped a minibatch with mean ratio %.3g > ratio_threshold %.3g",
                        float(stats["policy/ratio_mean"]),
                        config.ratio_threshold,
                    )
                else:
                    backward((pg_loss + vf_loss) * (batch.loss_mask[idx].sum() / group_tokens))
                result.minibatch_stats.append(stats)
                contributed = contributed or not skip
                # host syncs only where a decision needs one (they stall a GPU's queue)
                if config.early_stopping and any_process(
                    bool(stats["policy/policykl"] > 1.5 * config.target_kl)
                ):
                    result.early_stopped = True  # the drifted update is dropped, not applied
                    break
            if result.early_stopped:
                zero_grad()
                return result
            if contributed:
                optimizer_step()
                result.optimizer_steps += 1
    return result
