"""Collators: ragged token lists -> padded tensors, with masks (1 = real token) and loss labels.

Responses are right-padded so a row's real tokens start at position 0 (no position-id shift needed
for models without left-padding support); DPO prompts alone are left-padded, ready for generation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


def pad_sequences(
    seqs: list, value: int, side: str = "right", pad_to_multiple_of: int | None = None
) -> torch.Tensor:
    """Stack ragged 1-D sequences into (B, T_max) padded with `value` on `side` ("right" or "left")."""
    if side not in ("right", "left"):
        raise ValueError(f"side must be 'right' or 'left', got {side!r}")
    tensors = [torch.as_tensor(s, dtype=torch.long).reshape(-1) for s in seqs]
    width = max((t.numel() for t in tensors), default=0)
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    device = tensors[0].device if tensors else None  # rows already on an accelerator stay there
    out = torch.full((len(tensors), width), value, dtype=torch.long, device=device)
    for i, t in enumerate(tensors):
        if side == "right":
            out[i, : t.numel()] = t
        else:
            out[i, width - t.numel() :] = t
    return out


def cat_padded(first: torch.Tensor, second: torch.Tensor, value: int) -> torch.Tensor:
    """Concatenate two right-padded (B, T) batches along the batch dim, right-padding to the wider one."""
    width = max(first.shape[1], second.shape[1])
    pad = torch.nn.functional.pad
    return torch.cat(
        [
            pad(first, (0, width - first.shape[1]), value=value),
            pad(second, (0, width - second.shape[1]), value=value),
        ]
    )


def _pad_token_id(tokenizer: Any, fallback: int | None = None) -> int:
    pad = fallback if fallback is not None else getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    if pad is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token")
    return int(pad)


@dataclass
class RewardDataCollatorWithPadding:
    """Pads chosen and rejected sequences of a pair batch.

    In: features with input_ids_chosen, attention_mask_chosen, input_ids_rejected, attention_mask_rejected
    (optional `margin`). Out: the same keys as (B, T) tensors, `margin` as (B,) float, and return_loss=True.
    """

    tokenizer: Any
    padding: bool | str = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __call__(self, features: list[dict]) -> dict[str, Any]:
        pad = _pad_token_id(self.tokenizer)
        batch: dict[str, Any] = {}
        for side in ("chosen", "rejected"):
            ids_key, mask_key = f"input_ids_{side}", f"attention_mask_{side}"
            missing = [k for k in (ids_key, mask_key) if k not in features[0]]
            if missing:
                raise ValueError(
                    f"RewardDataCollatorWithPadding: features lack {missing}; tokenise the pairs first "
                    "(RewardTrainer does this for raw chosen/rejected text)"
                )
            ids = [f[ids_key][: self.max_length] if self.max_length else f[ids_key] for f in features]
            masks = [f[mask_key][: self.max_length] if self.max_length else f[mask_key] for f in features]
            batch[ids_key] = pad_sequences(ids, pad, "right", self.pad_to_multiple_of)
            batch[mask_key] = pad_sequences(masks, 0, "right", self.pad_to_multiple_of)
        if "margin" in features[0]:
            batch["margin"] = torch.tensor([float(f["margin"]) for f in features])
        batch["return_loss"] = True
        return batch


@dataclass
class DPODataCollatorWithPadding:
    """Builds the DPO batch from prompt / chosen / rejected token lists.

    Out: prompt_input_ids + prompt_attention_mask (left-padded), and for each side
    `{side}_input_ids` (prompt + response, right-padded), `{side}_attention_mask`, `{side}_labels`
    (response tokens only; prompt and padding hold label_pad_token_id). Precomputed
    reference_chosen_logps / reference_rejected_logps pass through as (B,) float tensors.
    """

    pad_token_id: int = 0
    label_pad_token_id: int = -100

    def __call__(self, features: list[dict]) -> dict[str, Any]:
        prompts = [list(f["prompt_input_ids"]) for f in features]
        batch: dict[str, Any] = {
            "prompt_input_ids": pad_sequences(prompts, self.pad_token_id, "left"),
            "prompt_attention_mask": pad_sequences([[1] * len(p) for p in prompts], 0, "left"),
        }
        for side in ("chosen", "rejected"):
            responses = [list(f[f"{side}_input_ids"]) for f in features]
            full = [p + r for p, r in zip(prompts, responses)]
            labels = [[self.label_pad_token_id] * len(p) + r for p, r in zip(prompts, responses)]
            batch[f"{side}_input_ids"] = pad_sequences(full, self.pad_token_id)
            batch[f"{side}_attention_mask"] = pad_sequences([[1] * len(x) for x in full], 0)
            batch[f"{side}_labels"] = pad_sequences(labels, self.label_pad_token_id)
        for key in ("reference_chosen_logps", "reference_rejected_logps"):
            if key in features[0]:
                batch[key] = torch.tensor([float(f[key]) for f in features])
        return batch


@dataclass
class SFTDataCollator:
    """Pads `input_ids` and builds `labels`: a token is trained on iff it is real and in `completion_mask`.

    Rows that already carry `labels` keep them (padded with -100).
    """

    pad_token_id: int
    label_pad_token_id: int = -100
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict]) -> dict[str, Any]:
        ids = [list(f["input_ids"]) for f in features]
        real = [[1] * len(x) for x in ids]
        if "labels" in features[0]:
            labels = [list(f["labels"]) for f in features]
        else:
            keep = [list(f.get("completion_mask") or r) for f, r in zip(features, real)]
            labels = [[t if k else self.label_pad_token_id for t, k in zip(x, m)] for x, m in zip(ids, keep)]
        return {
            "input_ids": pad_sequences(ids, self.pad_token_id, "right", self.pad_to_multiple_of),
            "attention_mask": pad_sequences(real, 0, "right", self.pad_to_multiple_of),
            "labels": pad_sequences(labels, self.label_pad_token_id, "right", self.pad_to_multiple_of),
        }
