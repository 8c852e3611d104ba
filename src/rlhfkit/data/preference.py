"""Paired preference data (chosen vs rejected) for the reward model and DPO.

Reward rows become `chosen_ids` / `rejected_ids` (TRL 1.x's names; the full text, prompt included: the
model scores whole sequences). TRL 0.x's tokenised columns (`input_ids_chosen` + `attention_mask_chosen`,
...) are read as well and renamed.
DPO rows become `prompt_ids`, `chosen_ids`, `rejected_ids` (TRL 1.x's names) where the responses hold
only the completion tokens (ending in EOS); the collator joins prompt and response later.
`label_preference_pairs` builds such pairs from two completions per prompt and a reward that ranks them.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rlhfkit.data.preparation import (
    as_prompt_completion,
    check_not_empty,
    columns_of,
    is_conversational,
    render_chat,
    require_columns,
    row_chat_kwargs,
    row_is_chat,
    split_prompt_completion_text,
    with_eos,
)

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

logger = logging.getLogger(__name__)

SIDES = ("chosen", "rejected")
REWARD_TOKENISED = ("chosen_ids", "rejected_ids")  # TRL 1.x's names, the prepared columns
# TRL 0.x's tokenised columns (documented by the seeds), and an interim spelling TRL 1.x still reads
TRL0_REWARD_TOKENISED = (
    "input_ids_chosen",
    "attention_mask_chosen",
    "input_ids_rejected",
    "attention_mask_rejected",
)
INTERIM_REWARD_TOKENISED = ("chosen_input_ids", "rejected_input_ids")


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
        return render_chat(tokenizer, list(prompt or []) + list(value), **row_chat_kwargs(example))
    if prompt is not None:
        prompt_text, completion = as_prompt_completion(example, tokenizer, completion_key=key)
        return prompt_text + completion
    if not isinstance(value, str):
        raise ValueError(
            f"column {key!r} must hold strings or lists of role/content messages, got {type(value).__name__}"
        )
    return value


def _tokenise_reward_row(example: dict, tokenizer: Any) -> dict:
    return {f"{side}_ids": tokenizer(_reward_text(example, side, tokenizer))["input_ids"] for side in SIDES}


def _unmasked_reward_row(example: dict) -> dict:
    """TRL 0.x's ids + attention mask -> the real tokens only (a pre-padded row loses its padding)."""
    out = {}
    for side in SIDES:
        ids, mask = example[f"input_ids_{side}"], example[f"attention_mask_{side}"]
        out[f"{side}_ids"] = [t for t, m in zip(ids, mask) if m]
    return out


def _renamed_reward_row(example: dict) -> dict:
    return {f"{side}_ids": list(example[f"{side}_input_ids"]) for side in SIDES}


def prepare_reward_dataset(
    dataset: Any,
    tokenizer: Any,
    max_length: int | None,
    overlong_policy: str = "drop",
    num_proc: int | None = None,
    owner: str = "RewardTrainer",
    arg: str = "train_dataset",
    keep_trl0_layout: bool = False,
) -> tuple[Any, dict[str, int | None]]:
    """Tokenise if needed, apply the length policy, validate. Returns (dataset, {"dropped", "truncated"}).

    A `datasets.IterableDataset` is prepared lazily: its over-long pairs are dropped or cut as they stream
    past, uncounted (None). With `keep_trl0_layout`, rows given in TRL 0.x's tokenised layout come back in
    it (a caller's own collator reads those columns, as the TRL 0.x docs say it may).
    """
    prepared, stats = _prepare_reward(dataset, tokenizer, max_length, overlong_policy, num_proc, owner, arg)
    if keep_trl0_layout and set(TRL0_REWARD_TOKENISED) <= set(columns_of(dataset)):
        prepared = prepared.map(_as_trl0_row, remove_columns=list(REWARD_TOKENISED))
    return prepared, stats


def _as_trl0_row(example: dict) -> dict:
    out = {}
    for side in SIDES:
        ids = list(example[f"{side}_ids"])
        out[f"input_ids_{side}"], out[f"attention_mask_{side}"] = ids, [1] * len(ids)
    return out


def _prepare_reward(
    dataset: Any,
    tokenizer: Any,
    max_length: int | None,
    overlong_policy: str,
    num_proc: int | None,
    owner: str,
    arg: str,
) -> tuple[Any, dict[str, int | None]]:
    check_not_empty(dataset, owner, arg)
    options = [REWARD_TOKENISED, TRL0_REWARD_TOKENISED, INTERIM_REWARD_TOKENISED, ("chosen", "rejected")]
    found = require_columns(dataset, options, owner, arg)
    names = columns_of(dataset)
    lazy = _is_iterable(dataset)
    map_kwargs = {} if lazy else {"num_proc": num_proc}  # IterableDataset.map has no num_proc
    remove = [c for c in names if c not in set(REWARD_TOKENISED) | {"margin"}]
    if found == ("chosen", "rejected"):
        if tokenizer is None:
            raise ValueError(
                f"{owner}: `processing_class` (a tokenizer) is needed to tokenise raw chosen/rejected text"
            )
        dataset = dataset.map(
            _tokenise_reward_row, fn_kwargs={"tokenizer": tokenizer}, remove_columns=remove, **map_kwargs
        )
    elif found != REWARD_TOKENISED:
        if found == INTERIM_REWARD_TOKENISED:
            warnings.warn(
                f"{owner}: the columns chosen_input_ids / rejected_input_ids in `{arg}` are read as "
                "chosen_ids / rejected_ids; name them so, as this spelling is being retired",
                FutureWarning,
                stacklevel=4,
            )
        rename = _unmasked_reward_row if found == TRL0_REWARD_TOKENISED else _renamed_reward_row
        dataset = dataset.map(rename, remove_columns=remove, **map_kwargs)
    else:
        dataset = dataset.remove_columns(remove)
    if lazy:
        return _cut_overlong_lazily(dataset, max_length, overlong_policy), {
            "dropped": None,
            "truncated": None,
        }
    _check_not_all_identical(dataset, "chosen_ids", "rejected_ids", owner, arg)
    return _apply_length_policy(dataset, max_length, overlong_policy, num_proc, owner, arg)


def _too_long(row: dict, max_length: int) -> bool:
    return max(len(row["chosen_ids"]), len(row["rejected_ids"])) > max_length


def _cut_row(row: dict, max_length: int) -> dict:
    return {k: row[k][:max_length] for k in REWARD_TOKENISED}


def _cut_overlong_lazily(dataset: Any, max_length: int | None, overlong_policy: str) -> Any:
    if max_length is None:
        return dataset
    if overlong_policy == "drop":
        return dataset.filter(lambda r: not _too_long(r, max_length))
    return dataset.map(_cut_row, fn_kwargs={"max_length": max_length})


def _apply_length_policy(
    dataset: Any, max_length: int | None, overlong_policy: str, num_proc: int | None, owner: str, arg: str
) -> tuple[Any, dict[str, int | None]]:
    """Drop or cut the pairs longer than max_length, counted and logged."""
    stats: dict[str, int | None] = {"dropped": 0, "truncated": 0}
    if max_length is None:
        return dataset, stats
    columns = dataset.select_columns(list(REWARD_TOKENISED))
    n_long = sum(_too_long(r, max_length) for r in columns)
    if n_long and overlong_policy == "drop":
        dataset = dataset.filter(lambda r: not _too_long(r, max_length), num_proc=num_proc)
        stats["dropped"] = n_long
    elif n_long:
        dataset = dataset.map(_cut_row, fn_kwargs={"max_length": max_length}, num_proc=num_proc)
        stats["truncated"] = n_long
    if n_long:
        what = "dropped" if overlong_policy == "drop" else "truncated"
        logger.warning(
            "%s: %d pairs of %s were longer than max_length=%d tokens and were %s", owner, n_long, arg,
            max_length, what,
        )  # fmt: skip
    if len(dataset) == 0:
        raise ValueError(
            f"{owner}: every pair of `{arg}` is longer than max_length={max_length}; raise max_length "
            "or use overlong_policy='truncate'"
        )
    return dataset, stats


# --- DPO ----------------------------------------------------------------------------------------------


def extract_prompt(example: dict) -> dict:
    """Split an implicit prompt off a pair: the longest shared start of `chosen` and `rejected`.

    Chats share their first messages; plain text shares its first characters, and a space just before
    the point where they differ goes to the responses (" blue." rather than "blue."), as TRL's
    `extract_prompt` does. Returns {"prompt", "chosen", "rejected"}.
    """
    chosen, rejected = example["chosen"], example["rejected"]
    shared = 0
    for a, b in zip(chosen, rejected):
        if a != b:
            break
        shared += 1
    if isinstance(chosen, str) and shared and chosen[shared - 1] == " ":
        shared -= 1
    return {"prompt": chosen[:shared], "chosen": chosen[shared:], "rejected": rejected[shared:]}


def _dpo_texts(example: dict, tokenizer: Any) -> tuple[str, str, str]:
    """(prompt, chosen completion, rejected completion) as text, for plain or chat rows; without a prompt
    column the prompt is the pair's shared start (`extract_prompt`)."""
    if example.get("prompt") is None:
        example = {**example, **extract_prompt(example)}
    prompt, chosen, rejected = example["prompt"], example["chosen"], example["rejected"]
    if is_conversational(chosen):
        kw = row_chat_kwargs(example)
        prompt_text, chosen_text = split_prompt_completion_text(tokenizer, list(prompt), list(chosen), **kw)
        _, rejected_text = split_prompt_completion_text(tokenizer, list(prompt), list(rejected), **kw)
        return prompt_text, chosen_text, rejected_text
    for key, value in (("prompt", prompt), ("chosen", chosen), ("rejected", rejected)):
        if not isinstance(value, str):
            raise ValueError(f"DPO column {key!r} must hold strings or role/content message lists")
    return prompt, chosen, rejected


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
    return dict(zip(DPO_TOKENISED, (p, c, r)))


DPO_TOKENISED = ("prompt_ids", "chosen_ids", "rejected_ids")  # TRL 1.x's names, the prepared columns
OLD_DPO_TOKENISED = ("prompt_input_ids", "chosen_input_ids", "rejected_input_ids")  # earlier names, renamed


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
    """Tokenise a DPO dataset into prompt_ids / chosen_ids / rejected_ids, each pair cut to max_length.

    Already-tokenised rows (those names, or the earlier prompt_input_ids / chosen_input_ids /
    rejected_input_ids) are renamed and cut. Text or chats with a prompt column, or only chosen/rejected
    (implicit prompt), are tokenised. A `datasets.IterableDataset` is prepared lazily, row by row.
    """
    check_not_empty(dataset, owner, arg)
    options = [DPO_TOKENISED, OLD_DPO_TOKENISED, ("prompt", "chosen", "rejected"), ("chosen", "rejected")]
    found = require_columns(dataset, options, owner, arg)
    names = columns_of(dataset)
    keep = {f"{p}_{s}_logps" for p in ("reference", "ref") for s in ("chosen", "rejected")}
    map_kwargs = (
        {} if _is_iterable(dataset) else {"num_proc": num_proc}
    )  # IterableDataset.map has no num_proc
    cut = {
        "max_length": max_length,
        "max_prompt_length": max_prompt_length,
        "truncation_mode": truncation_mode,
    }
    remove = [c for c in names if c not in keep]
    if found in (DPO_TOKENISED, OLD_DPO_TOKENISED):
        fn_kwargs = {"columns": found, **cut}
        dataset = dataset.map(_cut_tokenised_row, fn_kwargs=fn_kwargs, remove_columns=remove, **map_kwargs)
    else:
        if tokenizer is None:
            raise ValueError(f"{owner}: `processing_class` (a tokenizer) is needed to tokenise raw text")
        dataset = dataset.map(
            _tokenise_dpo_row,
            fn_kwargs={"tokenizer": tokenizer, **cut},
            remove_columns=remove,
            **map_kwargs,
        )
    if not _is_iterable(dataset):  # an iterable dataset cannot be scanned up front
        _check_not_all_identical(dataset, "chosen_ids", "rejected_ids", owner, arg)
    return dataset


def _is_iterable(dataset: Any) -> bool:
    return not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__")


def _cut_tokenised_row(
    example: dict,
    columns: tuple[str, str, str],
    max_length: int | None,
    max_prompt_length: int | None,
    truncation_mode: str,
) -> dict:
    p, c, r = truncate_dpo_row(
        *(list(example[name]) for name in columns), max_length, max_prompt_length, truncation_mode
    )
    return dict(zip(DPO_TOKENISED, (p, c, r)))


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
