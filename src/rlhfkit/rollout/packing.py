"""Padding-free scoring passes: every row's real query+response tokens packed into one (1, N) sequence.

Rollout rows stop at different lengths, and the padded (B, Lq + R) layout pays for every pad token in
every pass. Here the pad tokens are dropped, the rows are laid end to end, and position ids restart at 0
at each row. With no attention_mask, transformers 5 (`masking_utils.find_packed_sequence_indices`) reads
each restart as a new sequence and builds a block-diagonal causal mask, so no token attends across rows.
The outputs that predict each response token are then gathered back to the (B, R) layout.

That masking is only trusted for the model types listed below (their modeling code builds the mask with
`create_causal_mask` from `position_ids`) and the sdpa / eager attention backends; anything else keeps the
padded batch, with the reason logged once per model class.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from rlhfkit.core.chunked_logprobs import chunked_token_logprobs
from rlhfkit.rollout.lm_head import _last_hidden_state, _unwrap, find_lm_head

logger = logging.getLogger(__name__)

# checked in transformers 5: position ids feed the mask (packed-sequence detection) and the positions
_PACKABLE_MODEL_TYPES = frozenset({"gpt2", "llama", "qwen2"})
# backends whose mask comes from masking_utils' mask functions (flash / flex kernels not checked here)
_PACKABLE_ATTENTION = frozenset({"sdpa", "eager"})
# automatic switch: pack once this share of the padded batch is padding
MIN_PAD_FRACTION = 0.1
_logged_fallbacks: set[tuple[str, str]] = set()


def _unsupported_reason(model: nn.Module) -> str | None:
    base, reason = _unwrap(model)
    if reason is not None:
        return reason
    config = getattr(base, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in _PACKABLE_MODEL_TYPES:
        return f"model_type {model_type!r} is not known to mask packed rows apart"
    attention = getattr(config, "_attn_implementation", None)
    if attention not in _PACKABLE_ATTENTION:
        return f"attention implementation {attention!r} is not one of {sorted(_PACKABLE_ATTENTION)}"
    return None


def packing_supported(model: nn.Module) -> bool:
    """Whether `model` can score packed rows exactly; when not, the reason is logged once per model class."""
    reason = _unsupported_reason(model)
    if reason is None:
        return True
    key = (type(model).__name__, reason)
    if key not in _logged_fallbacks:
        _logged_fallbacks.add(key)
        logger.warning("%s: scoring padded batches, not packed rows, because %s", key[0], reason)
    return False


def worth_packing(attention_mask: torch.Tensor, min_pad_fraction: float = MIN_PAD_FRACTION) -> bool:
    """Whether at least `min_pad_fraction` of the (B, T) batch is padding (the automatic switch)."""
    return attention_mask.shape[0] > 1 and 1.0 - attention_mask.float().mean().item() >= min_pad_fraction


@dataclass(frozen=True)
class PackedRows:
    """The real tokens of a padded batch in one row, and where to read each response token's prediction."""

    input_ids: torch.Tensor  # (1, N)
    position_ids: torch.Tensor  # (1, N), restarting at 0 at each row
    index: torch.Tensor  # (B, R): packed position whose output predicts response token (b, j)


def pack_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, length_r: int
) -> PackedRows:
    """Pack (B, Lq + R) query+response rows whose last `length_r` columns are the response.

    Response token j of a row is predicted from padded column Lq + j - 1. Where that column is padding (a
    masked response token) the index points at the row's previous real token: junk, as in the padded path.
    """
    real = attention_mask.bool().reshape(-1)
    packed_at = (real.long().cumsum(0) - 1).clamp_(min=0).view_as(attention_mask)
    length_q = input_ids.shape[1] - length_r
    return PackedRows(
        input_ids=input_ids.reshape(-1)[real].unsqueeze(0),
        position_ids=position_ids.reshape(-1)[real].unsqueeze(0),
        index=packed_at[:, length_q - 1 : -1],
    )


def packed_logits_and_values(
    model: nn.Module, rows: PackedRows, *, with_values: bool = False, logits_to_keep: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R, V) logits predicting each response token and (B, R) values (None without a value head).

    `logits_to_keep`: the model takes that argument, so only the gathered positions are projected.
    """
    kwargs = {}
    if logits_to_keep:
        kwargs["logits_to_keep"] = rows.index.reshape(-1)  # a tensor of positions: (1, B * R, V) logits
    output = model(input_ids=rows.input_ids, attention_mask=None, position_ids=rows.position_ids, use_cache=False,
                   **kwargs)
    logits, values = (output[0], output[2]) if isinstance(output, tuple) else (output.logits, None)
    logits = logits[0].reshape(*rows.index.shape, -1) if logits_to_keep else logits[0, rows.index]
    if values is not None and with_values:
        values = values[0, rows.index]
    return logits, values if with_values else None


def packed_chunked_outputs(
    model: nn.Module,
    rows: PackedRows,
    responses: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_values: bool = False,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None:
    """`rollout.lm_head.chunked_response_outputs` over packed rows: (logprobs, values, entropy), each (B, R).

    The packed backbone's hidden states are caught by a hook and gathered to (B, R, H) before the chunked
    vocabulary projection. None when the model's head is not a plain linear layer (reason logged once).
    """
    head = find_lm_head(model)
    if head is None:
        return None
    captured: list[torch.Tensor] = []
    hook = head.backbone.register_forward_hook(lambda _m, _a, out: captured.append(_last_hidden_state(out)))
    try:
        output = model(input_ids=rows.input_ids, attention_mask=None, position_ids=rows.position_ids,
                       use_cache=False, logits_to_keep=1)
    finally:
        hook.remove()
    values = None
    if with_values:
        if not isinstance(output, tuple):
            raise ValueError("with_values=True needs a model with a value head (e.g. AutoModelForCausalLMWithValueHead)")
        values = output[2][0, rows.index].float()
    result = chunked_token_logprobs(
        captured[-1][0, rows.index], head.weight, head.bias, responses,
        temperature=temperature / head.logit_scale, with_entropy=with_entropy,
    )  # fmt: skip
    logprobs, entropy = result if with_entropy else (result, None)
    return logprobs, values, entropy
