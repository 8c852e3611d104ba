"""Unpaired preference data (one completion per row, labelled desirable or not) for KTO.

Rows hold `prompt`, `completion` and a boolean `label` (True = desirable), as text or as chats
(lists of role/content messages). A paired dataset (`prompt`, `chosen`, `rejected`) is first unpaired
into a desirable row and an undesirable one per pair (`unpair_preference_dataset`).

Tokenised rows hold `prompt_ids` and `completion_ids` (the completion ends in EOS for plain text; a chat
template places its own), cut from one tokenisation of prompt + completion where it stops matching the
prompt's own tokens. For the KL reference point each row also gets `KL_completion_ids`: the
completion of the previous row of its block of `kl_block_size` rows (the first row takes the block's last),
so within a training batch every prompt is scored with another row's completion. That needs the batches
to be these blocks, in order: KTOConfig's train_sampling_strategy="sequential".
`DataCollatorForUnpairedPreference` joins prompt and completion and pads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from rlhfkit.data.collators import pad_sequences
from rlhfkit.data.preparation import (
    as_prompt_completion,
    check_not_empty,
    columns_of,
    is_conversational,
    require_columns,
    row_is_chat,
)

logger = logging.getLogger(__name__)

TOKENISED = ("prompt_ids", "completion_ids", "label")
KEPT = (*TOKENISED, "KL_completion_ids", "ref_logps", "ref_KL_logps")


def _unpair_batch(batch: dict[str, list]) -> dict[str, list]:
    n = len(batch["chosen"])
    out = {key: values + values for key, values in batch.items() if key not in ("chosen", "rejected")}
    out["completion"] = batch["chosen"] + batch["rejected"]
    out["label"] = [True] * n + [False] * n
    return out


def _split_implicit_prompt(row: dict) -> dict:
    """Chats without a `prompt` column: the messages chosen and rejected share become the prompt."""
    chosen, rejected = row["chosen"], row["rejected"]
    if not (is_conversational(chosen) and is_conversational(rejected)):
        raise ValueError(
            "a paired dataset without a 'prompt' column must hold chats (role/content message lists) in "
            "'chosen' and 'rejected'; give plain-text pairs a 'prompt' column"
        )
    shared = 0
    while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
        shared += 1
    return {"prompt": chosen[:shared], "chosen": chosen[shared:], "rejected": rejected[shared:]}


def unpair_preference_dataset(dataset: Any, num_proc: int | None = None) -> Any:
    """`prompt`/`chosen`/`rejected` rows -> `prompt`/`completion`/`label` rows, two per pair.

    Other columns are repeated on both rows. Within each block of up to 1000 pairs the desirable rows come
    first, then the undesirable ones in the same order, so the KL completions of neighbouring rows
    (`prepare_kto_dataset`) come from other prompts. Chats without a `prompt` column split off the
    messages both sides share as the prompt.
    """
    if "prompt" not in columns_of(dataset):
        dataset = dataset.map(_split_implicit_prompt, num_proc=num_proc)
    return dataset.map(_unpair_batch, batched=True, remove_columns=columns_of(dataset), num_proc=num_proc)


def maybe_unpair_preference_dataset(dataset: Any, num_proc: int | None = None) -> Any:
    """`unpair_preference_dataset` for a paired dataset (`chosen` and `rejected` columns); others as given."""
    if {"chosen", "rejected"} <= set(columns_of(dataset)):
        return unpair_preference_dataset(dataset, num_proc)
    return dataset


def _check_labels(dataset: Any, owner: str, arg: str) -> list[bool]:
    labels = dataset["label"]
    bad = next((v for v in labels if not (isinstance(v, bool) or v in (0, 1))), None)
    if bad is not None or any(v is None for v in labels):
        raise ValueError(
            f"{owner}: the 'label' column of `{arg}` must hold booleans (True = desirable completion), got "
            f"{bad!r}"
        )
    return [bool(v) for v in labels]


def _tokenise_row(example: dict, tokenizer: Any) -> dict:
    """prompt_ids and completion_ids from one tokenisation of prompt + completion, split where it stops
    agreeing with the prompt's own tokens: a word that straddles the boundary is tokenised as in the whole
    text, the way the model reads it."""
    prompt, completion = as_prompt_completion(example, tokenizer)
    chat = row_is_chat(example)  # a chat template places its own special tokens, EOS included
    if not chat and tokenizer.eos_token and not completion.endswith(tokenizer.eos_token):
        completion += tokenizer.eos_token
    prompt_ids = tokenizer(prompt, add_special_tokens=not chat)["input_ids"] if prompt else []
    full_ids = tokenizer(prompt + completion, add_special_tokens=not chat)["input_ids"]
    shared = 0
    while shared < min(len(prompt_ids), len(full_ids)) and prompt_ids[shared] == full_ids[shared]:
        shared += 1
    return {
        "prompt_ids": full_ids[:shared],
        "completion_ids": full_ids[shared:],
        "label": bool(example["label"]),
    }


def _add_kl_completions(batch: dict[str, list]) -> dict[str, list]:
    completions = batch["completion_ids"]
    return {"KL_completion_ids": completions[-1:] + completions[:-1]}


def prepare_kto_dataset(
    dataset: Any,
    tokenizer: Any,
    max_length: int | None,
    kl_block_size: int | None,
    num_proc: int | None = None,
    owner: str = "KTOTrainer",
    arg: str = "train_dataset",
) -> Any:
    """Tokenise (unpairing paired rows first), drop rows whose prompt alone fills `max_length`, and add the
    KL completions when `kl_block_size` (the per-device train batch size) is given.

    Already tokenised rows (`prompt_ids`, `completion_ids`, `label`) are only checked, and get their KL
    completions if they lack them.
    """
    if not hasattr(dataset, "__len__"):
        raise ValueError(
            f"{owner}: `{arg}` must be a map-style datasets.Dataset; an IterableDataset (streaming) is not "
            "supported: each row's KL completion is its neighbour's, fixed before training"
        )
    check_not_empty(dataset, owner, arg)
    names = columns_of(dataset)
    if "label" not in names and ("completion" in names or "completion_ids" in names):
        raise ValueError(
            f"{owner}: `{arg}` has completions but no 'label' column; KTO needs one boolean per row "
            f"(True = a desirable completion). Its columns: {sorted(names)}"
        )
    found = require_columns(
        dataset, [TOKENISED, ("prompt", "completion", "label"), ("chosen", "rejected")], owner, arg
    )
    if found == ("chosen", "rejected"):
        dataset = unpair_preference_dataset(dataset, num_proc)
    names = columns_of(dataset)
    _check_labels(dataset, owner, arg)
    if found != TOKENISED:
        if tokenizer is None:
            raise ValueError(f"{owner}: `processing_class` (a tokenizer) is needed to tokenise raw text")
        dataset = dataset.map(
            _tokenise_row, fn_kwargs={"tokenizer": tokenizer}, remove_columns=names, num_proc=num_proc
        )
    dataset = dataset.remove_columns([c for c in columns_of(dataset) if c not in KEPT])
    if max_length is not None:
        before = len(dataset)
        dataset = dataset.filter(lambda row: len(row["prompt_ids"]) < max_length, num_proc=num_proc)
        if len(dataset) < before:
            logger.warning(
                "%s: dropped %d rows of %s whose prompt alone has max_length=%d tokens or more (no "
                "completion token would be left)",
                owner, before - len(dataset), arg, max_length,
            )  # fmt: skip
        check_not_empty(dataset, owner, f"{arg} (after dropping rows whose prompt fills max_length)")
    if kl_block_size and "KL_completion_ids" not in columns_of(dataset):
        dataset = dataset.map(_add_kl_completions, batched=True, batch_size=kl_block_size, num_proc=num_proc)
    return dataset


@dataclass
class DataCollatorForUnpairedPreference:
    """Pads unpaired rows into a KTO batch (TRL 1.x's collator of that name).

    In: rows with `prompt_ids`, `completion_ids`, `label` (and optionally `KL_completion_ids`, `ref_logps`,
    `ref_KL_logps`). Out: `input_ids` (prompt + completion, right-padded), `attention_mask`, and
    `completion_mask` (1 = a completion token), the same three with a `KL_` prefix for the mismatched
    pairs, `label` as a (B,) bool tensor and the reference log-probs as (B,) floats. Each sequence is cut
    to `max_length` tokens from the right before padding.
    """

    pad_token_id: int
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch: dict[str, torch.Tensor] = {}
        for prefix, key in (("", "completion_ids"), ("KL_", "KL_completion_ids")):
            if key not in examples[0]:
                continue
            ids, masks = [], []
            for row in examples:
                prompt, completion = list(row["prompt_ids"]), list(row[key])
                ids.append((prompt + completion)[: self.max_length])
                masks.append(([0] * len(prompt) + [1] * len(completion))[: self.max_length])
            multiple = self.pad_to_multiple_of
            batch[f"{prefix}input_ids"] = pad_sequences(ids, self.pad_token_id, "right", multiple)
            batch[f"{prefix}attention_mask"] = pad_sequences(
                [[1] * len(x) for x in ids], 0, "right", multiple
            )
            batch[f"{prefix}completion_mask"] = pad_sequences(masks, 0, "right", multiple)
        batch["label"] = torch.tensor([bool(row["label"]) for row in examples], dtype=torch.bool)
        for key in ("ref_logps", "ref_KL_logps"):
            if key in examples[0]:
                batch[key] = torch.tensor([float(row[key]) for row in examples])
        return batch
