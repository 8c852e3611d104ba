"""Groups of completions for GRPO: what one sampling round holds, DAPO's dynamic sampling, and the statistics.

A `SampledGroups` is one round of generation: `num_generations` completions of each prompt on consecutive
rows, scored. Dynamic sampling (Yu et al. 2025, DAPO) keeps only the groups whose rewards differ (a group of
equal rewards has zero advantage everywhere: no learning signal) and samples more rounds until the batch is
full. Where DAPO samples without limit, `fill_batch` stops after a given number of rounds and fills the rest
with dropped groups, so that a step never waits forever on a task the policy always solves (or never does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.rollout.generation import pad_left


@dataclass
class SampledGroups:
    """One or more rounds of groups. batch: N rows with `scores` (N,) set (NaN: no reward applied);
    per_source: (S, N) the score of each reward function (NaN where it returned None); applies: (S, N) bool,
    False where it returned None; prompts: the N prompts as given to reward functions; completions: the N
    decoded completions."""

    batch: RolloutBatch
    per_source: torch.Tensor
    applies: torch.Tensor
    prompts: list
    completions: list[str]

    def __len__(self) -> int:
        return len(self.batch)

    def rows(self, rows: list[int]) -> SampledGroups:
        index = torch.tensor(rows, dtype=torch.long, device=self.batch.query_ids.device)
        return SampledGroups(
            self.batch[index],
            self.per_source[:, index],
            self.applies[:, index],
            [self.prompts[i] for i in rows],
            [self.completions[i] for i in rows],
        )


def concat_rollouts(batches: list[RolloutBatch], pad_token_id: int) -> RolloutBatch:
    """Stack rollout batches of different widths: queries re-padded on the left, responses on the right."""
    if len(batches) == 1:
        return batches[0]
    queries = [q[m.bool()] for b in batches for q, m in zip(b.query_ids, b.query_mask)]
    query_ids, query_mask = pad_left(queries, pad_token_id)
    width = max(b.responses.shape[1] for b in batches)

    def joined(name: str, fill: float | int | bool) -> torch.Tensor | None:
        parts = [getattr(b, name) for b in batches]
        if parts[0] is None or parts[0].dim() < 2:
            return None if parts[0] is None else torch.cat(parts)
        return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=fill) for p in parts])

    fields = {
        "responses": pad_token_id,
        "response_mask": False,
        "loss_mask": False,
        "logprobs": 0.0,
        "ref_logprobs": 0.0,
        "scores": 0.0,
        "advantages": 0.0,
        "model_mask": False,
    }
    joined_fields = {name: joined(name, fill) for name, fill in fields.items()}
    return RolloutBatch(query_ids, query_mask.to(batches[0].query_mask.dtype), **joined_fields)


def concat_groups(parts: list[SampledGroups], pad_token_id: int) -> SampledGroups:
    return SampledGroups(
        concat_rollouts([p.batch for p in parts], pad_token_id),
        torch.cat([p.per_source for p in parts], dim=1),
        torch.cat([p.applies for p in parts], dim=1),
        [x for p in parts for x in p.prompts],
        [x for p in parts for x in p.completions],
    )


def informative_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N,) scores -> (N / G,) bool: the group's scored completions do not all have the same reward."""
    grouped = scores.reshape(-1, group_size)
    present = ~grouped.isnan()
    high = torch.where(present, grouped, -torch.inf).max(1).values
    low = torch.where(present, grouped, torch.inf).min(1).values
    return (present.sum(1) >= 2) & (high > low)


def fill_batch(
    sample: Callable[[], SampledGroups],
    num_groups: int,
    group_size: int,
    max_rounds: int,
    pad_token_id: int,
    any_process: Callable[[bool], bool] = bool,
) -> tuple[SampledGroups, dict[str, float]]:
    """Call `sample()` until `num_groups` informative groups are collected or `max_rounds` rounds are done.

    With several processes, `any_process(flag)` says whether any of them is still short: all sample the same
    number of rounds (the prompt schedule and any collective inside generation stay in step). Extra
    informative groups are left out; a short batch is completed with dropped groups, earliest first.
    Returns the groups and {"sampling/dropped_groups", "sampling/rounds"}.
    """
    kept, dropped, dropped_count, rounds = [], [], 0, 0
    while rounds < max_rounds and any_process(len(kept) < num_groups):
        groups = sample()
        rounds += 1
        useful = informative_groups(groups.batch.scores, group_size).tolist()
        dropped_count += useful.count(False)
        for g, ok in enumerate(useful):
            (kept if ok else dropped).append((groups, g))
    chosen = (kept + dropped)[:num_groups]
    parts = [groups.rows(list(range(g * group_size, (g + 1) * group_size))) for groups, g in chosen]
    stats = {"sampling/dropped_groups": float(dropped_count), "sampling/rounds": float(rounds)}
    return concat_groups(parts, pad_token_id), stats


def completion_stats(lengths: torch.Tensor, truncated: torch.Tensor) -> dict[str, torch.Tensor]:
    """TRL's completion-length statistics from (N,) completion lengths and (N,) truncation flags."""
    lengths = lengths.float()
    stats = {
        "completions/mean_length": lengths.mean(),
        "completions/min_length": lengths.min(),
        "completions/max_length": lengths.max(),
        "completions/clipped_ratio": truncated.float().mean(),
    }
    finished = lengths[~truncated]
    if finished.numel() == 0:  # every completion was cut: TRL logs zeros
        finished = lengths.new_zeros(1)
    stats.update(
        {
            "completions/mean_terminated_length": finished.mean(),
            "completions/min_terminated_length": finished.min(),
            "completions/max_terminated_length": finished.max(),
        }
    )
    return stats


def nan_std(values: torch.Tensor) -> torch.Tensor:
    """Unbiased std over the non-NaN entries (NaN with fewer than two)."""
    present = values[~values.isnan()]
    return present.std() if present.numel() >= 2 else values.new_tensor(float("nan"))


def reward_stats(scores: torch.Tensor, per_source: torch.Tensor, names: list[str], group_size: int) -> dict:
    """reward, reward_std, rewards/<name>/mean|std and frac_reward_zero_std over a (gathered) batch."""
    stats = {"reward": torch.nanmean(scores), "reward_std": nan_std(scores)}
    for name, values in zip(names, per_source):
        stats[f"rewards/{name}/mean"] = torch.nanmean(values)
        stats[f"rewards/{name}/std"] = nan_std(values)
    stats["frac_reward_zero_std"] = (~informative_groups(scores, group_size)).float().mean()
    return stats


def reward_problem(
    per_source: torch.Tensor, applies: torch.Tensor, advantages: torch.Tensor, sources: list[str]
) -> str | None:
    """Why a generation batch must not be trained on, or None when it may (for the non-finite guard).

    per_source, applies: (S, N) over the batch of every process; advantages: (N,); sources: each source's
    name, e.g. "reward function 'f'". A source's NaN or inf, a batch with no reward at all (every function
    returned None), or advantages made non-finite by huge rewards (their mean or std overflows) skip every
    update of the batch. Some rows without a reward are fine: they get advantage 0.
    """
    bad = applies & ~torch.isfinite(per_source)
    if bool(bad.any()):
        named = [
            f"{name} returned NaN or inf for {int(rows.sum())} of {rows.numel()} completions"
            for name, rows in zip(sources, bad)
            if bool(rows.any())
        ]
        return f"a non-finite reward ({'; '.join(named)})"
    if not bool(applies.any()):
        n = applies.shape[1]
        return f"no usable reward (every reward function returned None for all {n} completions)"
    if not bool(torch.isfinite(advantages).all()):
        largest = per_source[applies].abs().max().item()
        return (
            f"non-finite advantages (rewards as large as {largest:.3g} overflow the float32 mean/std they "
            "are scaled by; scale the reward down)"
        )
    return None


def _pad_columns(x: torch.Tensor, left: int, right: int, value: float | int) -> torch.Tensor:
    parts = [x.new_full((x.shape[0], left), value), x, x.new_full((x.shape[0], right), value)]
    return torch.cat(parts, dim=1)


def padded_to_multiple(batch: RolloutBatch, multiple: int | None, pad_token_id: int) -> RolloutBatch:
    """`batch` with its query columns left-padded and its response columns right-padded to multiples of
    `multiple` (TRL's `pad_to_multiple_of`: fewer distinct shapes for compilers); None: as it is."""
    if not multiple:
        return batch
    left, right = -batch.query_ids.shape[1] % multiple, -batch.responses.shape[1] % multiple
    if left == 0 and right == 0:
        return batch
    changes = {
        "query_ids": _pad_columns(batch.query_ids, left, 0, pad_token_id),
        "query_mask": _pad_columns(batch.query_mask, left, 0, 0),
        "responses": _pad_columns(batch.responses, 0, right, pad_token_id),
    }
    for name in ("response_mask", "loss_mask", "logprobs", "ref_logprobs", "model_mask"):
        value = getattr(batch, name)
        if value is not None:
            changes[name] = _pad_columns(value, 0, right, 0)
    return batch.replace(**changes)
