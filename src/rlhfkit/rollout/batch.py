"""The typed batch that crosses from sampling to training in every online trainer (PPO, RLOO, ...).

One row per sampled completion. Queries are left-padded, responses right-padded, so column j of
`responses` is the j-th generated token of every row. Two masks, never confused:

- `response_mask`: 1 where the response holds a real token (the model sees it);
- `loss_mask`: 1 where that token is trained on (a subset of `response_mask`: PPO's optional
  per-sample response masks remove tool output or forced tokens from the loss).

A multi-turn rollout also carries `model_mask`: 1 where the policy sampled the token, 0 where a tool or an
environment inserted it; such tokens stay in the sequence (the model reads them) but are neither trained on
nor counted as generated.

Fields filled later in a step (reference logprobs, values, scores, advantages, returns) start as
None; `replace` returns a copy with them set, so a step reads as a chain of small functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

# Fields whose dim 1 runs over response positions (and so are trimmed together).
_PER_TOKEN = (
    "responses",
    "response_mask",
    "loss_mask",
    "logprobs",
    "ref_logprobs",
    "values",
    "advantages",
    "returns",
    "old_logprobs",
    "model_mask",
)


@dataclass(frozen=True)
class RolloutBatch:
    """Shapes: B rows, Q query columns, R response columns.

    query_ids (B, Q) long, left-padded; query_mask (B, Q) bool; responses (B, R) long, right-padded;
    response_mask (B, R) bool; loss_mask (B, R) bool. Optional: logprobs (B, R) sampling-policy
    logprobs, ref_logprobs (B, R), values (B, R), scores (B,) one per sequence, advantages (B, R) or
    (B,) for sequence-level estimators, returns (B, R), old_logprobs (B, R) the training policy's logprobs
    at sampling time when a separate pass computes them (the sampler correction; None: `logprobs` serve),
    model_mask (B, R) bool, False at tokens a tool or environment inserted (None: the policy sampled all).
    """

    query_ids: torch.Tensor
    query_mask: torch.Tensor
    responses: torch.Tensor
    response_mask: torch.Tensor
    loss_mask: torch.Tensor
    logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    model_mask: torch.Tensor | None = None

    def __post_init__(self) -> None:
        rows = self.query_ids.shape[0]
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None and value.shape[0] != rows:
                raise ValueError(
                    f"RolloutBatch.{f.name} has {value.shape[0]} rows, query_ids has {rows}: "
                    "every field holds one row per sampled completion"
                )
        if self.responses.shape != self.response_mask.shape or self.responses.shape != self.loss_mask.shape:
            raise ValueError(
                f"RolloutBatch: responses {tuple(self.responses.shape)}, response_mask "
                f"{tuple(self.response_mask.shape)} and loss_mask {tuple(self.loss_mask.shape)} must match"
            )

    @classmethod
    def from_sequences(
        cls,
        queries: Sequence[torch.Tensor],
        responses: Sequence[torch.Tensor],
        pad_token_id: int,
        loss_masks: Sequence[torch.Tensor] | None = None,
    ) -> RolloutBatch:
        """Pad lists of 1-D query and response tensors; `loss_masks` (0/1 per response token) narrow
        the loss."""
        from rlhfkit.rollout.generation import pad_left, pad_right

        query_ids, query_mask = pad_left(queries, pad_token_id)
        response_ids, response_mask = pad_right(responses, pad_token_id)
        loss_mask = response_mask
        if loss_masks is not None:
            loss_mask = response_mask & pad_right([m.long() for m in loss_masks], 0)[0].bool()
        return cls(query_ids, query_mask, response_ids, response_mask, loss_mask)

    def __len__(self) -> int:
        return self.query_ids.shape[0]

    def model_tokens(self) -> torch.Tensor:
        """(B, R) bool: the response tokens the policy sampled (tool and environment insertions left out)."""
        mask = self.response_mask.bool()
        return mask if self.model_mask is None else mask & self.model_mask.bool()

    def replace(self, **changes: torch.Tensor | None) -> RolloutBatch:
        """A copy with some fields set (shapes are re-checked)."""
        return dataclasses.replace(self, **changes)

    def __getitem__(self, rows: torch.Tensor | slice | Sequence[int]) -> RolloutBatch:
        """The rows `rows` of every field, trimmed to the query and response columns those rows use."""
        picked = {
            f.name: None if (v := getattr(self, f.name)) is None else v[rows]
            for f in dataclasses.fields(self)
        }
        return RolloutBatch(**picked).trimmed()

    def trimmed(self) -> RolloutBatch:
        """Drop leading query columns and trailing response columns that are padding in every row."""
        used_q = self.query_mask.any(0)
        q_start = int(used_q.long().argmax()) if bool(used_q.any()) else self.query_mask.shape[1]
        used_r = self.response_mask.any(0).nonzero()
        r_end = int(used_r.max()) + 1 if used_r.numel() else 0
        if q_start == 0 and r_end == self.responses.shape[1]:
            return self
        changes = {"query_ids": self.query_ids[:, q_start:], "query_mask": self.query_mask[:, q_start:]}
        for name in _PER_TOKEN:
            value = getattr(self, name)
            if value is not None and value.dim() >= 2:
                changes[name] = value[:, :r_end]
        return dataclasses.replace(self, **changes)

    def to(self, device: torch.device | str) -> RolloutBatch:
        return RolloutBatch(
            **{
                f.name: None if (v := getattr(self, f.name)) is None else v.to(device)
                for f in dataclasses.fields(self)
            }
        )

    def minibatches(
        self, size: int, order: torch.Tensor | None = None
    ) -> Iterator[tuple[torch.Tensor, RolloutBatch]]:
        """(row indices, rows) for consecutive chunks of `size` rows, in `order` (default: 0..B-1)."""
        if size < 1:
            raise ValueError(f"minibatch size must be a positive integer, got {size}")
        order = torch.arange(len(self), device=self.query_ids.device) if order is None else order
        for start in range(0, len(order), size):
            idx = order[start : start + size]
            yield idx, self[idx]
