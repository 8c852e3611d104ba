"""Paired preference data (chosen vs rejected) for the reward model and DPO.

Reward rows become `input_ids_chosen` / `attention_mask_chosen` / `input_ids_rejected` /
`attention_mask_rejected` (the full text, prompt included: the model scores whole sequences).
DPO rows become `prompt_input_ids`, `chosen_input_ids`, `rejected_input_ids` where the responses hold
only the completion tokens (ending in EOS); the collator joins prompt and response later.
`label_preference_pairs` builds such pairs from two completions per prompt and a reward that ranks them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rlhfkit.data.preparation import (
    as_prompt_completion,
    check_not_empty,
    columns_of,
    is_conversational,
    render_chat,
    require_columns,
    row_is_chat,
    split_prompt_completion_text,
    with_eos,
)

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

logger = logging.getLogger(__name__)

REWARD_TOKENISED = (
    "input_ids_chosen",
    "attention_mask_chosen",
    "input_ids_rejected",
    "attention_mask_rejected",
)


def _check_not_all_identical(dataset: Any, first: str, second: str, owner: str, arg: str) -> None:
    same = sum(a == b for a, b in zip(dataset[first], dataset[second]))
    if same == len(dataset):
        raise ValueError(
            f"{owner}: in `{arg}` the chosen and rejected sides are identical in every one of the "
            f"{same} rows; "
            "there is no preference to learn (check the column mapping)"
        )
    if same:
        logger.warning(
            "%s: %d of %d rows of %s have chosen == rejected; they carry no signal",
            owner,
            same,
            len(dataset),
            arg,
        )


# --- reward model ---------------------------------------------------------------------------------------


def _reward_text(example: dict, key: str, tokenizer: Any) -> str:
    value = example[key]
    prompt = example.get("prompt")
    if is_conversational(value):
        return render_chat(tokenizer, list(prompt or []) + list(value))
    if prompt is not None:
        prompt_text, completion = as_prompt_completion(example, tokenizer, completion_key=key)
        return prompt_text + completion
    if not isinstance(value, str):
        raise ValueError(
            f"column {key!r} must hold strings or lists of role/content messages, got {type(value).__name__}"
        )
    return value


def _tokenise_reward_row(example: dict, tokenizer: Any) -> dict:
    out = {}
    for side in ("chosen", "rejected"):
        enc = tokenizer(_reward_text(example, side, tokenizer))
        out[f"input_ids_{side}"] = enc["input_ids"]
        out[f"attention_mask_{side}"] = enc["attention_mask"]
    return out


def prepare_reward_dataset(
    dataset: Any,
    tokenizer: Any,
    max_length: int | None,
    overlong_policy: str = "drop",
    num_proc: int | None = None,
    owner: str = "RewardTrainer",
    arg: str = "train_dataset",
) -> tuple[Any, dict[str, int]]:
    """Tokenise if needed, apply the length policy, validate. Returns (dataset, {"dropped", "truncated"})."""
    check_not_empty(dataset, owner, arg)
    found = require_columns(dataset, [REWARD_TOKENISED, ("chosen", "rejected")], owner, arg)
    names = columns_of(dataset)
    keep = set(REWARD_TOKENISED) | {"margin"}
    if found == ("chosen", "rejected"):
        if tokenizer is None:
            raise ValueError(
                f"{owner}: `processing_class` (a tokenizer) is needed to tokenise raw chosen/rejected text"
            )
        dataset = dataset.map(
            _tokenise_reward_row,
            fn_kwargs={"tokenizer": tokenizer},
            remove_columns=[c for c in names if c not in keep],
            num_proc=num_proc,
        )
    else:
        dataset = dataset.remove_columns([c for c in names if c not in keep])
    _check_not_all_identical(dataset, "input_ids_chosen", "input_ids_rejected", owner, arg)

    stats = {"dropped": 0, "truncated": 0}
    if max_length is not None:

        def too_long(row):
            return max(len(row["input_ids_chosen"]), len(row["input_ids_rejected"])) > max_length

        n_long = sum(too_long(r) for r in dataset.select_columns(["input_ids_chosen", "input_ids_rejected"]))
        if n_long and overlong_policy == "drop":
            dataset = dataset.filter(lambda r: not too_long(r), num_proc=num_proc)
            stats["dropped"] = n_long
        elif n_long:
            dataset = dataset.map(
                lambda r: {k: r[k][:max_length] for k in REWARD_TOKENISED}, num_proc=num_proc
            )
            stats["truncated"] = n_long
        if n_long:
            logger.warning(
                "%s: %d pairs of %s were longer than max_length=%d tokens and were %s",
                owner,
                n_long,
                arg,
                max_length,
                "dropped" if overlong_policy == "drop" else "truncated",
            )
        if len(dataset) == 0:
            raise ValueError(
                f"{owner}: every pair of `{arg}` is longer than max_length={max_length}; raise max_length "
                "or use overlong_policy='truncate'"
            )
    return dataset, stats


# --- DPO ----------------------------------------------------------------------------------------------


def _dpo_texts(example: dict, tokenizer: Any) -> tuple[str, str, str]:
    """(prompt, chosen completion, rejected completion) as text, for plain or chat rows."""
    chosen, rejected = example["chosen"], example["rejected"]
    if is_conversational(chosen):
        prompt = example.get("prompt")
        if prompt is None:  # implicit prompt: everything before the final message, shared by both sides
            if chosen[:-1] != rejected[:-1]:
                raise ValueError(
                    "without a 'prompt' column, chosen and rejected chats must share all but the last message"
                )
            prompt, chosen, rejected = chosen[:-1], chosen[-1:], rejected[-1:]
        prompt_text, chosen_text = split_prompt_completion_text(tokenizer, list(prompt), list(chosen))
        _, rejected_text = split_prompt_completion_text(tokenizer, list(prompt), list(rejected))
        return prompt_text, chosen_text, rejected_text
    for key in ("prompt", "chosen", "rejected"):
        if not isinstance(example.get(key), str):
            raise ValueError(f"DPO column {key!r} must hold strings or role/content message lists")
    return example["prompt"], chosen, rejected


def truncate_dpo_row(
    prompt_ids: list[int],
    chosen_ids: list[int],
    rejected_ids: list[int],
    max_length: int | None,
    max_prompt_length: int | None,
    truncation_mode: str,
) -> tuple[list[int], list[int], list[int]]:
    """Fit prompt + longer response into max_length: first shorten the prompt, then the responses."""
    if max_length is None:
        return prompt_ids, chosen_ids, rejected_ids
    longer = max(len(chosen_ids), len(rejected_ids))
    if len(prompt_ids) + longer > max_length and max_prompt_length is not None:
        if truncation_mode == "keep_end":
            prompt_ids = prompt_ids[-max_prompt_length:]
        else:
            prompt_ids = prompt_ids[:max_prompt_length]
    room = max_length - len(prompt_ids)
    if room < 1:
        raise ValueError(
            f"a prompt of {len(prompt_ids)} tokens leaves no room for the response within "
            f"max_length={max_length}; "
            "set max_prompt_length below max_length"
        )
    return prompt_ids, chosen_ids[:room], rejected_ids[:room]


def _tokenise_dpo_row(
    example: dict, tokenizer: Any, max_length: int | None, max_prompt_length: int | None, truncation_mode: str
) -> dict:
    prompt, chosen, rejected = _dpo_texts(example, tokenizer)
    eos = None if row_is_chat(example) else tokenizer.eos_token_id  # a chat template places its own EOS
    prompt_ids = tokenizer(prompt)["input_ids"] if prompt else []
    chosen_ids = with_eos(tokenizer(chosen, add_special_tokens=False)["input_ids"], eos)
    rejected_ids = with_eos(tokenizer(rejected, add_special_tokens=False)["input_ids"], eos)
    p, c, r = truncate_dpo_row(
        prompt_ids, chosen_ids, rejected_ids, max_length, max_prompt_length, truncation_mode
    )
    return {"prompt_input_ids": p, "chosen_input_ids": c, "rejected_input_ids": r}


def prepare_dpo_dataset(
    dataset: Any,
    tokenizer: Any,
    max_length: int | None,
    max_prompt_length: int | None,
    truncation_mode: str = "keep_end",
    num_proc: int | None = None,
    owner: str = "DPOTrainer",
    arg: str = "train_dataset",
):
    """Tokenise a DPO dataset; already-tokenised rows (prompt_/chosen_/rejected_input_ids) pass through."""
    check_not_empty(dataset, owner, arg)
    tokenised = ("prompt_input_ids", "chosen_input_ids", "rejected_input_ids")
    found = require_columns(
        dataset, [tokenised, ("prompt", "chosen", "rejected"), ("chosen", "rejected")], owner, arg
    )
    names = columns_of(dataset)
    keep = set(tokenised) | {"reference_chosen_logps", "reference_rejected_logps"}
    if found == ("chosen", "rejected") and not is_conversational(dataset[0]["chosen"]):
        raise ValueError(
            f"{owner}: `{arg}` has plain-text chosen/rejected but no 'prompt' column; DPO needs the prompt "
            "separately (or give chats as role/content message lists)"
        )
    if found != tokenised:
        if tokenizer is None:
            raise ValueError(f"{owner}: `processing_class` (a tokenizer) is needed to tokenise raw text")
        dataset = dataset.map(
            _tokenise_dpo_row,
            fn_kwargs={
                "tokenizer": tokenizer,
                "max_length": max_length,
                "max_prompt_length": max_prompt_length,
                "truncation_mode": truncation_mode,
            },
            remove_columns=[c for c in names if c not in keep],
            num_proc=num_proc,
        )
    else:
        dataset = dataset.remove_columns([c for c in names if c not in keep])
    _check_not_all_identical(dataset, "chosen_input_ids", "rejected_input_ids", owner, arg)
    return dataset


def label_preference_pairs(
    prompts: Sequence[str],
    completions_a: Sequence[str],
    completions_b: Sequence[str],
    judge: Callable[[list[str]], list[float]],
) -> Dataset:
    """Judge two completions per prompt and keep the preferred one as "chosen".

    Returns a `datasets.Dataset` with "prompt", "chosen" and "rejected" columns (the reward/DPO
    format). Pairs the judge scores equally carry no preference and are dropped; the count is logged
    and stored in `dataset.info.description`.
    """
    if not len(prompts) == len(completions_a) == len(completions_b):
        raise ValueError(
            "prompts, completions_a and completions_b must have the same length, got "
            f"{len(prompts)}, {len(completions_a)} and {len(completions_b)}"
        )
    from datasets import Dataset, DatasetInfo

    scores_a, scores_b = list(judge(list(completions_a))), list(judge(list(completions_b)))
    if len(scores_a) != len(completions_a) or len(scores_b) != len(completions_b):
        raise ValueError("judge must return one score per completion")
    rows: dict[str, list[str]] = {"prompt": [], "chosen": [], "rejected": []}
    ties = 0
    for prompt, a, b, score_a, score_b in zip(prompts, completions_a, completions_b, scores_a, scores_b):
        if score_a == score_b:
            ties += 1
            continue
        chosen, rejected = (a, b) if score_a > score_b else (b, a)
        rows["prompt"].append(prompt)
        rows["chosen"].append(chosen)
        rows["rejected"].append(rejected)
    logger.info("label_preference_pairs: kept %d pairs, dropped %d ties", len(rows["prompt"]), ties)
    info = DatasetInfo(description=f"preference pairs labelled by a judge; {ties} ties dropped")
    return Dataset.from_dict(rows, info=info)
