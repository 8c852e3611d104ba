"""DPO's forward passes: chosen and rejected as one batch, and the summed log-probs of their responses.

`concatenated_forward` returns logits, as TRL 0.x's API does (from the position before the earliest
response token on, when the model's forward takes `logits_to_keep`). `sides_logps`, which training and the
reference pass use (DPO's chosen/rejected sides, KTO's completion/KL sides), scores the label tokens in
chunks from the final hidden states instead when the (2B, T, V) logits would be large (`rollout.lm_head`).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from rlhfkit.core.logprobs import selective_log_softmax
from rlhfkit.data.collators import cat_padded
from rlhfkit.rollout.lm_head import chunked_label_logprobs
from rlhfkit.rollout.scoring import forward_accepts, prefers_chunked_head

DPO_SIDES = ("chosen", "rejected")


class ForwardMethods:
    """Mixed into `DPOTrainer`; relies on its `padding_value` and `label_pad_token_id`. A subclass may
    override `concatenated_forward`: the chunked path is then left alone."""

    def concatenated_inputs(
        self, batch: dict[str, torch.Tensor], sides: tuple[str, ...] = DPO_SIDES
    ) -> dict[str, torch.Tensor]:
        """Stack the rows of each side in order (chosen: first B rows, then rejected), padded to one width.

        `sides` names the `{side}_input_ids` / `_attention_mask` / `_labels` groups of the batch (KTO's
        are "completion" and "KL")."""
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
        labels = labels[:, 1:]
        logits = logits[:, :-1]
        response_mask = labels != self.label_pad_token_id
        logprobs = selective_log_softmax(logits, torch.where(response_mask, labels, 0))
        return (logprobs * response_mask).sum(-1)

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
        n = batch["chosen_input_ids"].shape[0]
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
        None unless asked for. `sides_logps` over chosen and rejected."""
        (chosen, rejected), means = self.sides_logps(model, batch, DPO_SIDES, with_mean_logits)
        return chosen, rejected, *(means or (None, None))

    def sides_logps(
        self,
        model: nn.Module,
        batch: dict[str, torch.Tensor],
        sides: tuple[str, ...] = DPO_SIDES,
        with_mean_logits: bool = False,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """One forward pass over the rows of every side: the summed response log-probs of each side, (B_s,)
        each, and their mean response logits (None unless asked for).

        Training and the reference pass use it. When the logits would be large (`prefers_chunked_head`)
        and the head is a plain linear layer, the label tokens are scored in chunks from the final hidden
        states (`rollout.lm_head`): no (N, T', V) tensor. Otherwise, or when a subclass overrides
        `concatenated_forward` (used for chosen/rejected), the full logits give the same numbers.
        """
        inputs = self.concatenated_inputs(batch, sides)
        labels, chunked = inputs["concatenated_labels"], None
        sizes = [batch[f"{side}_input_ids"].shape[0] for side in sides]
        custom = (
            sides == DPO_SIDES and type(self).concatenated_forward is not ForwardMethods.concatenated_forward
        )
        if not custom and prefers_chunked_head(model, labels.numel()):
            chunked = chunked_label_logprobs(
                model,
                labels,
                ignore_index=self.label_pad_token_id,
                with_mean_logits=with_mean_logits,
                input_ids=inputs["concatenated_input_ids"],
                attention_mask=inputs["concatenated_attention_mask"],
                use_cache=False,
            )
        if chunked is None:  # full logits: small enough, a custom forward, or a head the chunked path lacks
            if custom:
                chosen, rejected, logits_chosen, logits_rejected = self.concatenated_forward(model, batch)
                logps, logits = [chosen, rejected], [logits_chosen, logits_rejected]
            else:
                all_logps, all_logits = self._forward_logps(model, inputs)
                logps, logits = list(all_logps.split(sizes)), all_logits.split(sizes)
            if not with_mean_logits:
                return logps, None
            # taken now, so the (N, T', V) logits are not alive during the reference pass
            return logps, [self._mean_response_logit(x, y) for x, y in zip(logits, labels.split(sizes))]
        logprobs, mask, mean_logits = chunked
        logps = list(logprobs.sum(-1).split(sizes))
        if not with_mean_logits:
            return logps, None
        # over the positions that predict response tokens, as `_mean_response_logit` averages them
        means = (mean_logits * mask).sum(1) / mask.sum(1).clamp(min=1)
        return logps, list(means.split(sizes))

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
