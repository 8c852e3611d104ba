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

    In: prepared rows (`chosen_ids`, `rejected_ids`, every token real) or TRL 0.x's tokenised rows
    (input_ids_chosen, attention_mask_chosen, input_ids_rejected, attention_mask_rejected); optional
    `margin`. Out: input_ids_{side} and attention_mask_{side} as (B, T) tensors, `margin` as (B,) float,
    and return_loss=True.
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
            ids, masks = zip(*(_reward_side(f, side) for f in features))
            if self.max_length:
                ids, masks = [i[: self.max_length] for i in ids], [m[: self.max_length] for m in masks]
            batch[f"input_ids_{side}"] = pad_sequences(list(ids), pad, "right", self.pad_to_multiple_of)
            batch[f"attention_mask_{side}"] = pad_sequences(list(masks), 0, "right", self.pad_to_multiple_of)
        if "margin" in features[0]:
            batch["margin"] = torch.tensor([float(f["margin"]) for f in features])
        batch["return_loss"] = True
        return batch


def _reward_side(row: dict, side: str) -> tuple[list[int], list[int]]:
    """(token ids, attention mask) of one side of a reward pair, from either spelling of its columns."""
    if f"{side}_ids" in row:
        ids = list(row[f"{side}_ids"])
        return ids, [1] * len(ids)
    ids_key, mask_key = f"input_ids_{side}", f"attention_mask_{side}"
    if ids_key in row and mask_key in row:
        return list(row[ids_key]), list(row[mask_key])
    raise ValueError(
        f"RewardDataCollatorWithPadding: a row needs {side + '_ids'!r} (or {ids_key!r} and {mask_key!r}); "
        f"it has {sorted(row)}. RewardTrainer prepares raw chosen/rejected text into these columns"
    )


@dataclass
class DPODataCollatorWithPadding:
    """Builds the DPO batch from prepared rows (`prompt_ids`, `chosen_ids`, `rejected_ids` token lists).

    Out: prompt_input_ids + prompt_attention_mask (left-padded), and for each side
    `{side}_input_ids` (prompt + response, right-padded), `{side}_attention_mask`, `{side}_labels`
    (response tokens only; prompt and padding hold label_pad_token_id). Precomputed
    reference_chosen_logps / reference_rejected_logps pass through as (B,) float tensors.
    """

    pad_token_id: int = 0
    label_pad_token_id: int = -100
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict]) -> dict[str, Any]:
        prompts = [list(_column(f, "prompt_ids")) for f in features]
        batch: dict[str, Any] = {
            "prompt_input_ids": pad_sequences(prompts, self.pad_token_id, "left"),
            "prompt_attention_mask": pad_sequences([[1] * len(p) for p in prompts], 0, "left"),
        }
        multiple = self.pad_to_multiple_of
        for side in ("chosen", "rejected"):
            responses = [list(_column(f, f"{side}_ids")) for f in features]
            full = [p + r for p, r in zip(prompts, responses)]
            labels = [[self.label_pad_token_id] * len(p) + r for p, r in zip(prompts, responses)]
            batch[f"{side}_input_ids"] = pad_sequences(full, self.pad_token_id, "right", multiple)
            batch[f"{side}_attention_mask"] = pad_sequences(
                [[1] * len(x) for x in full], 0, "right", multiple
            )
            batch[f"{side}_labels"] = pad_sequences(labels, self.label_pad_token_id, "right", multiple)
        batch.update(_reference_logps(features))
        return batch


def _column(row: dict, name: str) -> Any:
    """row[name], or a clear error naming what the prepared example lacks."""
    if name not in row:
        raise ValueError(
            f"a prepared preference example needs {name!r}; it has {sorted(row)} (the trainers prepare raw "
            "prompt/chosen/rejected data into these columns)"
        )
    return row[name]


def _reference_logps(features: list[dict]) -> dict[str, torch.Tensor]:
    """Precomputed reference log-probs under both spellings (TRL 0.x `reference_*`, TRL 1.x `ref_*`)."""
    out = {}
    for side in ("chosen", "rejected"):
        for key in (f"reference_{side}_logps", f"ref_{side}_logps"):
            if key in features[0]:
                values = torch.tensor([float(f[key]) for f in features])
                out[f"reference_{side}_logps"] = out[f"ref_{side}_logps"] = values
    return out


@dataclass
class DataCollatorForPreference:
    """TRL 1.x's preference batch: chosen rows then rejected rows, one padded (2B, T) tensor.

    DPO examples (`prompt_ids`, `chosen_ids`, `rejected_ids`) give `input_ids` = prompt + response,
    `attention_mask` and `completion_mask` (1 on response tokens), each sequence first cut to `max_length`
    ("keep_start" keeps its beginning, "keep_end" its end); precomputed `ref_chosen_logps` /
    `ref_rejected_logps` pass through. Reward examples (`chosen_ids`, `rejected_ids`, optional `margin`)
    give `input_ids`, `attention_mask` (and `margin`): the columns DPOTrainer and RewardTrainer prepare.
    """

    pad_token_id: int
    max_length: int | None = None
    truncation_mode: str = "keep_start"
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __post_init__(self) -> None:
        if self.truncation_mode not in ("keep_start", "keep_end"):
            raise ValueError(
                f"truncation_mode must be 'keep_start' or 'keep_end', got {self.truncation_mode!r}"
            )
        if self.return_tensors != "pt":
            raise ValueError(f"return_tensors must be 'pt' (PyTorch), got {self.return_tensors!r}")

    def __call__(self, examples: list[dict]) -> dict[str, Any]:
        if not examples:
            raise ValueError("DataCollatorForPreference: got an empty list of examples")
        first = examples[0]
        has_prompt = "prompt_ids" in first
        rows, masks = [], []
        for side in ("chosen", "rejected"):
            for ex in examples:
                prompt = list(_column(ex, "prompt_ids")) if has_prompt else []
                response = list(_column(ex, f"{side}_ids"))
                rows.append(self._cut(prompt + response))
                masks.append(self._cut([0] * len(prompt) + [1] * len(response)))
        multiple = self.pad_to_multiple_of
        batch: dict[str, Any] = {
            "input_ids": pad_sequences(rows, self.pad_token_id, "right", multiple),
            "attention_mask": pad_sequences([[1] * len(r) for r in rows], 0, "right", multiple),
        }
        if has_prompt:
            batch["completion_mask"] = pad_sequences(masks, 0, "right", multiple)
            batch.update({k: v for k, v in _reference_logps(examples).items() if k.startswith("ref_")})
        if "margin" in first:
            batch["margin"] = torch.tensor([float(ex["margin"]) for ex in examples])
        return batch

    def _cut(self, seq: list[int]) -> list[int]:
        if self.max_length is None or len(seq) <= self.max_length:
            return seq
        return seq[: self.max_length] if self.truncation_mode == "keep_start" else seq[-self.max_length :]
