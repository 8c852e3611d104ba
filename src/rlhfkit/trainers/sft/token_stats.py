"""Per-label-token log-probabilities for SFT's losses ('nll', 'dft'), and the statistics TRL logs beside it.

Position t of a (B, T) batch is scored on labels[t + 1] (transformers' causal-LM shift); -100 is not
scored. PEFT's prompt tuning prepends virtual tokens to the model's positions: only the last T positions,
those of the batch, are read. The statistics are sums over scored tokens, without gradient: (entropy sum,
top-1 hits, count), from which the trainer logs `entropy` and `mean_token_accuracy` (the fraction of
label tokens that are the model's most likely next token).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlhfkit.core.logprobs import entropy_from_logits, rows_per_chunk
from rlhfkit.rollout.lm_head import LMHead, forward_hidden, head_token_logprobs

Stats = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _shifted(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits (B, T-1, V) of the batch's own positions, targets (B, T-1), mask (B, T-1) True = scored)."""
    logits = logits[:, logits.shape[1] - labels.shape[1] :]  # PEFT prompt tuning prepends virtual tokens
    targets = labels[:, 1:].to(logits.device)
    return logits[:, :-1], targets, targets != -100


def logits_token_stats(logits: torch.Tensor, labels: torch.Tensor) -> Stats:
    """The statistics alone, from full (B, T, V) logits, without gradient."""
    with torch.no_grad():
        logits, targets, mask = _shifted(logits.detach(), labels)
        entropy = entropy_from_logits(logits)[mask].sum()
        hits = (logits.argmax(-1) == targets)[mask].sum()
    return entropy, hits, mask.sum()


def label_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From full (B, T, V) logits: (logprobs (B, T-1) float32, 0 where not scored, with gradient;
    mask (B, T-1) bool, True = scored)."""
    shifted, targets, mask = _shifted(logits, labels)
    logprobs = torch.log_softmax(shifted.float(), -1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    return logprobs * mask, mask


def logits_label_stats(
    logits: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, Stats]:
    """`label_logprobs` and the stats."""
    return (*label_logprobs(logits, labels), logits_token_stats(logits, labels))


def dft_token_losses(logprobs: torch.Tensor) -> torch.Tensor:
    """Dynamic Fine-Tuning (Wu et al. 2025): each token's -log p weighted by its probability p, the weight
    without gradient, so the gradient is p times cross-entropy's. Any shape; 0 stays 0 (log p = 0)."""
    return -logprobs.exp().detach() * logprobs


def dft_loss(
    outputs, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None = None
) -> torch.Tensor:
    """TRL 1.x's public DFT loss (SFTConfig(loss_type='dft') trains with it): from a model output's (B, T, V)
    `logits` and causal-LM `labels` (B, T, -100 = not scored; position t scores labels[t + 1]), the
    `dft_token_losses` summed over the scored tokens and divided by `num_items_in_batch` (None: their
    count). E.g. two equally likely tokens: every term is 0.5 * log 2, half the cross-entropy."""
    logprobs, mask = label_logprobs(outputs.logits, labels)
    count = mask.sum() if num_items_in_batch is None else num_items_in_batch
    return dft_token_losses(logprobs).sum() / torch.as_tensor(count, device=logprobs.device)


def chunked_label_stats(
    model: torch.nn.Module, head: LMHead, labels: torch.Tensor, forward: dict
) -> tuple[torch.Tensor, torch.Tensor, Stats]:
    """`logits_label_stats` from the final hidden states, projecting only the scored rows, in chunks: no
    (B, T, V) logits. The top-1 hits take one more projection of those rows, without gradient."""
    _, hidden = forward_hidden(model, head, **forward)
    hidden = hidden[:, hidden.shape[1] - labels.shape[1] :]  # PEFT prompt tuning prepends virtual tokens
    hidden, targets = hidden[:, :-1], labels[:, 1:].to(hidden.device)
    mask = targets != -100
    rows, row_targets = hidden[mask], targets[mask]
    scored, entropy = head_token_logprobs(head, rows, row_targets, with_entropy=True)
    logprobs = torch.zeros(mask.shape, dtype=scored.dtype, device=scored.device).masked_scatter(mask, scored)
    with torch.no_grad():
        step = rows_per_chunk(head.weight.shape[0], None)
        hits = sum(
            (F.linear(chunk, head.weight, head.bias).argmax(-1) == want).sum()
            for chunk, want in zip(rows.detach().split(step), row_targets.split(step))
        )
        hits = torch.as_tensor(hits, device=rows.device)
    return logprobs, mask, (entropy.detach().sum(), hits, mask.sum())
