"""DPO's forward passes: chosen and rejected as one batch, and the summed log-probs of their responses.

`concatenated_forward` returns logits, as TRL 0.x's API does (from the position before the earliest
response token on, when the model's forward takes `logits_to_keep`). `_scored_rows`, which training and the
reference pass use (DPO's chosen/rejected sides through `_scored_pass`, KTO's completion/KL sides through
`sides_logps`), scores the label tokens in chunks from the final hidden states instead when the (N, T, V)
logits would be large (`rollout.lm_head`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from rlhfkit.core.logprobs import selective_log_softmax
from rlhfkit.core.preference_weights import length_desensitised_logps, log_sum_squared_probs, wpo_pair_weights
from rlhfkit.data.collators import cat_padded
from rlhfkit.rollout.lm_head import chunked_label_logprobs
from rlhfkit.rollout.scoring import forward_accepts, prefers_chunked_head

DPO_SIDES = ("chosen", "rejected")


def pair_count(batch: dict[str, torch.Tensor]) -> int:
    """B, the number of pairs: rlhfkit's batch has chosen_* rows, TRL 1.x's stacks 2B rows in input_ids."""
    if "chosen_input_ids" in batch:
        return batch["chosen_input_ids"].shape[0]
    return batch["input_ids"].shape[0] // 2


@dataclass
class ScoredPairs:
    """What one forward pass over a pair batch yields, (B,) each: sequence log-probs of both sides, their
    mean logits (logged) and WPO's pair weights, the last two None unless asked for."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    mean_chosen: torch.Tensor | None = None
    mean_rejected: torch.Tensor | None = None
    weights: torch.Tensor | None = None

    @classmethod
    def split(
        cls,
        logps: torch.Tensor,
        n: int,
        means: torch.Tensor | None = None,
        weights: torch.Tensor | None = None,
    ) -> ScoredPairs:
        """From stacked (2B,) rows, chosen first."""
        mean_chosen, mean_rejected = (None, None) if means is None else (means[:n], means[n:])
        return cls(logps[:n], logps[n:], mean_chosen, mean_rejected, weights)


class ForwardMethods:
    """Mixed into `DPOTrainer`; relies on its `padding_value`, `label_pad_token_id` and `ld_alpha`. A
    subclass may override `concatenated_forward`: the chunked path is then left alone."""

    ld_alpha: float | None = None  # LD-DPO's weight of the tokens past the shorter response's length

    def concatenated_inputs(
        self, batch: dict[str, torch.Tensor], sides: tuple[str, ...] = DPO_SIDES
    ) -> dict[str, torch.Tensor]:
        """Stack the rows of each side in order (chosen: first B rows, then rejected), padded to one width.

        `sides` names the `{side}_input_ids` / `_attention_mask` / `_labels` groups of the batch (KTO's are
        "completion" and "KL"). A batch of TRL 1.x's `DataCollatorForPreference` (input_ids,
        attention_mask, completion_mask) is stacked already; its labels are the completion tokens.
        """
        if sides == DPO_SIDES and "completion_mask" in batch:
            ids = batch["input_ids"]
            return {
                "concatenated_input_ids": ids,
                "concatenated_attention_mask": batch["attention_mask"],
                "concatenated_labels": ids.masked_fill(
                    batch["completion_mask"] == 0, self.label_pad_token_id
                ),
            }
        out = {}
        for key, pad in (
            ("input_ids", self.padding_value),
            ("attention_mask", 0),
            ("labels", self.label_pad_token_id),
        ):
            parts = [batch[f"{side}_{key}"] for side in sides]
            out[f"concatenated_{key}"] = functools.reduce(lambda a, b: cat_padded(a, b, pad), parts)
        return out

    def sequence_logps(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Summed log-probs of the label tokens: logits (N, T, V), labels (N, T) -> (N,).

        The token at t is scored by the logits at t-1; label_pad positions contribute nothing.
        """
        logprobs, response_mask = self.token_logps(logits, labels)
        return (logprobs * response_mask).sum(-1)

    def token_logps(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs of the label tokens and their mask: logits (N, T, V), labels (N, T) ->
        (N, T-1) each; position t scores labels[t + 1], 0 where the label is label_pad."""
        labels = labels[:, 1:]
        response_mask = labels != self.label_pad_token_id
        logprobs = selective_log_softmax(logits[:, :-1], torch.where(response_mask, labels, 0))
        return logprobs * response_mask, response_mask

    def concatenated_forward(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One forward pass over both sides: (chosen_logps, rejected_logps, chosen_logits, rejected_logits).

        Log-probs are summed over each response, (B,) each. The logits are per token, (B, T', V) each,
        as TRL 0.x's API returns them: T' is the padded width of the concatenated batch, or, for a model
        whose forward takes `logits_to_keep`, its last positions from the one before the earliest
        response token on (the prompt-only head of the batch is never scored).
        """
        logps, logits = self._forward_logps(model, self.concatenated_inputs(batch))
        n = pair_count(batch)
        return logps[:n], logps[n:], logits[:n], logits[n:]

    def _forward_logps(
        self, model: nn.Module, inputs: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed response log-probs (N,), logits (N, T', V)) of `concatenated_inputs` rows, full logits."""
        labels = inputs["concatenated_labels"]
        kwargs = {}
        keep = self._logits_to_keep(model, labels)
        if keep is not None:  # the prompt-only head of the batch needs no vocabulary projection
            kwargs["logits_to_keep"] = keep
            labels = labels[:, -keep:]
        logits = model(
            input_ids=inputs["concatenated_input_ids"],
            attention_mask=inputs["concatenated_attention_mask"],
            use_cache=False,
            **kwargs,
        ).logits
        return self.sequence_logps(logits, labels), logits

    def _concatenated_logps(
        self, model: nn.Module, batch: dict[str, torch.Tensor], with_mean_logits: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(chosen_logps, rejected_logps, chosen mean logit, rejected mean logit), (B,) each; the means are
        None unless asked for (`_scored_pass`)."""
        scored = self._scored_pass(model, batch, with_mean_logits)
        return scored.chosen, scored.rejected, scored.mean_chosen, scored.mean_rejected

    def _scored_pass(
        self, model: nn.Module, batch: dict[str, torch.Tensor], with_mean_logits: bool = False,
        with_weights: bool = False,
    ) -> ScoredPairs:  # fmt: skip
        """DPO's chosen and rejected rows scored in one pass (`_scored_rows`), split into the two sides."""
        logps, means, weights = self._scored_rows(model, batch, DPO_SIDES, with_mean_logits, with_weights)
        return ScoredPairs.split(logps, pair_count(batch), means, weights)

    def sides_logps(
        self,
        model: nn.Module,
        batch: dict[str, torch.Tensor],
        sides: tuple[str, ...] = DPO_SIDES,
        with_mean_logits: bool = False,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """The rows of every side scored in one pass: each side's sequence log-probs, (B_s,) each, and their
        mean response logits (None unless asked for)."""
        sizes = [batch[f"{side}_input_ids"].shape[0] for side in sides]
        logps, means, _ = self._scored_rows(model, batch, sides, with_mean_logits)
        return list(logps.split(sizes)), (None if means is None else list(means.split(sizes)))

    def _scored_rows(
        self, model: nn.Module, batch: dict[str, torch.Tensor], sides: tuple[str, ...],
        with_mean_logits: bool = False, with_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:  # fmt: skip
        """One forward over the rows of `sides`: (sequence log-probs (N,), LD-DPO's when `ld_alpha` is set;
        mean response logits (N,) or None; WPO's pair weights or None).

        When the (N, T, V) logits would be large (`prefers_chunked_head`) and the head is a plain linear
        layer, the label tokens are scored in chunks from the final hidden states (`rollout.lm_head`): no
        (N, T', V) tensor. WPO's weights need the full distribution, so they take the full-logits path, as
        does a subclass that overrides `concatenated_forward` (DPO's sides): same numbers.
        """
        inputs = self.concatenated_inputs(batch, sides)
        labels, chunked = inputs["concatenated_labels"], None
        custom = (
            sides == DPO_SIDES and type(self).concatenated_forward is not ForwardMethods.concatenated_forward
        )
        if not custom and not with_weights and prefers_chunked_head(model, labels.numel()):
            chunked = chunked_label_logprobs(
                model,
                labels,
                ignore_index=self.label_pad_token_id,
                with_mean_logits=with_mean_logits,
                input_ids=inputs["concatenated_input_ids"],
                attention_mask=inputs["concatenated_attention_mask"],
                use_cache=False,
            )
        if chunked is not None:
            logprobs, mask, mean_logits = chunked
            # over the positions that predict response tokens, as `_mean_response_logit` averages them
            means = None if mean_logits is None else (mean_logits * mask).sum(1) / mask.sum(1).clamp(min=1)
            return self._reduce(logprobs, mask, None), means, None
        # full logits: small enough, a custom forward, WPO, or a head the chunked path lacks
        if custom:
            chosen, rejected, logits_chosen, logits_rejected = self.concatenated_forward(model, batch)
            logps, logits = torch.cat([chosen, rejected]), torch.cat([logits_chosen, logits_rejected])
        else:
            logps, logits = self._forward_logps(model, inputs)
        # taken now, so the (N, T', V) logits are not alive during the reference pass
        means = self._mean_response_logit(logits, labels) if with_mean_logits else None
        weights = None
        if self.ld_alpha is not None or with_weights:
            logprobs, mask = self.token_logps(logits, labels[:, -logits.shape[1] :])
            logps = self._reduce(logprobs, mask, logps)
            if with_weights:
                weights = wpo_pair_weights(logprobs, log_sum_squared_probs(logits[:, :-1]), mask)
        return logps, means, weights

    def _reduce(self, logprobs: torch.Tensor, mask: torch.Tensor, sums: torch.Tensor | None) -> torch.Tensor:
        """Sequence log-probs from per-token ones (2B, T) -> (2B,): LD-DPO's weighting, else the sums."""
        if self.ld_alpha is not None:
            return length_desensitised_logps(logprobs, mask, self.ld_alpha)
        return logprobs.sum(-1) if sums is None else sums

    def _mean_response_logit(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean logit over the vocabulary at the positions that predict response tokens: (N, T', V) -> (N,).

        `labels` (N, T) are the concatenated labels of the same rows; their last T' columns line up with
        the logits.
        """
        response_mask = labels[:, -logits.shape[1] :][:, 1:] != self.label_pad_token_id
        # sum over the vocabulary first: no (N, T', V) temporary just for a logged statistic
        row_sums = logits[:, :-1].detach().sum(-1)
        counts = (response_mask.sum(1) * logits.shape[-1]).clamp(min=1)
        return (row_sums * response_mask).sum(1) / counts

    def _logits_to_keep(self, model: nn.Module, labels: torch.Tensor) -> int | None:
        """How many final positions need logits: from the one before the earliest label on (None: all).

        Saves the vocabulary projection, its backward and the softmax over prompt positions that are never
        scored. Exact: the LM head is applied per position, so the kept logits equal a full forward's.
        """
        if not forward_accepts(model, "logits_to_keep"):
            return None
        labelled = labels != self.label_pad_token_id
        rows = labelled.any(1)
        if not bool(rows.any()):
            return None
        first = int(labelled.float().argmax(1)[rows].min())
        keep = labels.shape[1] - max(first - 1, 0)
        return keep if keep < labels.shape[1] else None
