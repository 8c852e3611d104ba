"""Padding-free scoring passes: the real query+response tokens of a padded batch packed into fewer rows.

Rollout rows stop at different lengths, and the padded (B, Lq + R) layout pays for every pad token in
every pass. Here the pad tokens are dropped and the rows are laid end to end, several to a packed row
(first-fit decreasing, no packed row longer than the padded one), with position ids restarting at 0 at
each row. With no attention_mask, transformers 5 (`masking_utils.find_packed_sequence_indices`) reads each
restart as a new sequence and builds a block-diagonal causal mask, so no token attends across rows. The
outputs that predict each response token are then gathered back to the (B, R) layout.

That masking is only trusted for the model types listed below (their modeling code builds the mask with
`create_causal_mask` from `position_ids`) and the sdpa / eager attention backends; anything else keeps the
padded batch, with the reason logged once per model class.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from rlhfkit.rollout.lm_head import (
    LMHead,
    _last_hidden_state,
    find_lm_head,
    head_token_logprobs,
    known_base_model,
    warn_fallback_once,
)

logger = logging.getLogger(__name__)

# checked in transformers 5: position ids feed the mask (packed-sequence detection) and the positions
_PACKABLE_MODEL_TYPES = frozenset({"gpt2", "llama", "qwen2"})
# backends whose mask comes from masking_utils' mask functions (flash / flex kernels not checked here)
_PACKABLE_ATTENTION = frozenset({"sdpa", "eager"})
# automatic switch: pack when that saves at least this share of the padded batch's positions
MIN_SAVED_FRACTION = 0.1
_logged_fallbacks: set[tuple[str, str]] = set()


def _unsupported_reason(model: nn.Module) -> str | None:
    base = known_base_model(model, _PACKABLE_MODEL_TYPES, "mask packed rows apart")
    if isinstance(base, str):
        return base
    attention = getattr(base.config, "_attn_implementation", None)
    if attention not in _PACKABLE_ATTENTION:
        return f"attention implementation {attention!r} is not one of {sorted(_PACKABLE_ATTENTION)}"
    return None


def packing_supported(model: nn.Module) -> bool:
    """Whether `model` can score packed rows exactly; when not, the reason is logged once per model class."""
    reason = _unsupported_reason(model)
    if reason is None:
        return True
    warn_fallback_once(logger, _logged_fallbacks, model, "padded batches, not packed rows", reason)
    return False


@dataclass(frozen=True)
class PackedRows:
    """The real tokens of a padded batch packed into K rows, and where to read each response token's
    prediction."""

    input_ids: torch.Tensor  # (K, L)
    position_ids: torch.Tensor  # (K, L), restarting at 0 at each row (unused tail tokens: each at 0)
    index: torch.Tensor  # (B, R): flat position in (K * L) whose output predicts response token (b, j)


def _first_fit_decreasing(lengths: list[int], capacity: int) -> tuple[list[int], list[int], list[int]]:
    """Bin of each row, its offset in the bin, and each bin's fill; longest rows placed first."""
    fills: list[int] = []
    bins, offsets = [0] * len(lengths), [0] * len(lengths)
    for row in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        k = next((k for k, fill in enumerate(fills) if fill + lengths[row] <= capacity), len(fills))
        if k == len(fills):
            fills.append(0)
        bins[row], offsets[row] = k, fills[k]
        fills[k] += lengths[row]
    return bins, offsets, fills


def pack_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, length_r: int
) -> PackedRows:
    """Pack (B, Lq + R) query+response rows, whose last `length_r` columns are the response, into K <= B rows.

    Rows are laid end to end in packed rows no longer than the padded one (first-fit decreasing), not in
    one long sequence: the dense attention mask sdpa / eager build is quadratic in the packed row's length.
    Response token j is predicted from padded column Lq + j - 1; where that column is padding (a masked
    response token) the index points at the row's previous real token: junk, as in the padded path.
    """
    real = attention_mask.bool()
    bins, offsets, fills = _first_fit_decreasing(real.sum(1).tolist(), input_ids.shape[1])
    count, length = len(fills), max(max(fills), 1)
    base = torch.tensor([k * length + o for k, o in zip(bins, offsets)], device=input_ids.device)
    rank = (real.long().cumsum(1) - 1).clamp_(min=0)  # place of each token among its row's real tokens
    dest = (base.unsqueeze(1) + rank).clamp_(max=count * length - 1)
    packed_ids = input_ids.new_zeros(
        count * length
    )  # the unused tail holds token 0 at position 0: its own rows
    packed_positions = position_ids.new_zeros(count * length)
    packed_ids[dest[real]] = input_ids[real]
    packed_positions[dest[real]] = position_ids[real]
    length_q = input_ids.shape[1] - length_r
    return PackedRows(
        input_ids=packed_ids.view(count, length),
        position_ids=packed_positions.view(count, length),
        index=dest[:, length_q - 1 : -1],
    )


def maybe_pack(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    length_r: int,
    packed: bool | None,
) -> PackedRows | None:
    """`forward_response`'s switch: packed rows, or None to score the padded batch.

    True packs whenever the model supports it; None (automatic) also needs the packed batch to be at least
    `MIN_SAVED_FRACTION` smaller than the padded one; False never packs.
    """
    if packed is False or input_ids.shape[0] == 0 or not packing_supported(model):
        return None
    rows = pack_rows(input_ids, attention_mask, position_ids, length_r)
    if packed is None and rows.input_ids.numel() > (1.0 - MIN_SAVED_FRACTION) * input_ids.numel():
        return None
    return rows


def _run(model: nn.Module, rows: PackedRows, head: LMHead | None) -> tuple[object, torch.Tensor | None]:
    """The model's output on the packed rows, and (with `head`) its backbone's (K, L, H) hidden states.

    With a plain head only one position is projected (`logits_to_keep=1`): the caller projects the gathered
    response positions, so the query tokens in the packed rows cost no vocabulary projection.
    """
    if head is None:
        return model(
            input_ids=rows.input_ids, attention_mask=None, position_ids=rows.position_ids, use_cache=False
        ), None
    captured: list[torch.Tensor] = []
    hook = head.backbone.register_forward_hook(lambda _m, _a, out: captured.append(_last_hidden_state(out)))
    try:
        output = model(
            input_ids=rows.input_ids,
            attention_mask=None,
            position_ids=rows.position_ids,
            use_cache=False,
            logits_to_keep=1,
        )
    finally:
        hook.remove()
    return output, captured[-1]


def _gather(x: torch.Tensor, rows: PackedRows) -> torch.Tensor:
    """(K, L, ...) packed outputs -> (B, R, ...) at the positions predicting each response token."""
    return x.reshape(-1, *x.shape[2:])[rows.index]


def _values(output, rows: PackedRows) -> torch.Tensor:
    if not isinstance(output, tuple):
        raise ValueError(
            "with_values=True needs a model with a value head (e.g. AutoModelForCausalLMWithValueHead)"
        )
    return _gather(output[2], rows).float()


def packed_logits_and_values(
    model: nn.Module, rows: PackedRows, *, with_values: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R, V) logits predicting each response token and (B, R) values (None unless asked for)."""
    head = find_lm_head(model)  # a head it does not know: full logits over the packed rows (logged once)
    output, hidden = _run(model, rows, head)
    if head is None:
        logits = _gather(output[0] if isinstance(output, tuple) else output.logits, rows)
    else:
        logits = F.linear(_gather(hidden, rows), head.weight, head.bias)
        if head.logit_scale != 1.0:
            logits = logits * head.logit_scale
    return logits, _values(output, rows) if with_values else None


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

    The gathered (B, R, H) hidden states go through the chunked vocabulary projection. None when the
    model's head is not a plain linear layer (reason logged once).
    """
    head = find_lm_head(model)
    if head is None:
        return None
    output, hidden = _run(model, rows, head)
    result = head_token_logprobs(
        head, _gather(hidden, rows), responses, temperature, with_entropy=with_entropy
    )
    logprobs, entropy = result if with_entropy else (result, None)
    return logprobs, _values(output, rows) if with_values else None, entropy
