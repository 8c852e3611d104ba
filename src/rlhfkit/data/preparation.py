"""Turn raw text or chat datasets into token ids, before any expensive work, with clear errors.

Three shapes of input are recognised:
  * plain text columns (`text`, `prompt`/`completion`, `prompt`/`chosen`/`rejected`);
  * conversational columns: lists of {"role", "content"} messages, rendered with the tokenizer's
    chat template;
  * already tokenised columns, passed through after validation.
SFT preparation lives here; the paired (reward / DPO) preparation is in `rlhfkit.data.preference`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rlhfkit.data.assistant_masks import assistant_token_mask
from rlhfkit.data.language_modeling import IGNORE_INDEX

logger = logging.getLogger(__name__)


# --- checks -------------------------------------------------------------------------------------------


def check_not_empty(dataset: Any, owner: str, arg: str) -> None:
    if dataset is None:
        return
    try:
        n = len(dataset)
    except TypeError:  # iterable datasets: cannot tell cheaply
        return
    if n == 0:
        raise ValueError(f"{owner}: `{arg}` is empty (0 rows); give it at least one example")


def columns_of(dataset: Any) -> list[str]:
    names = getattr(dataset, "column_names", None)
    if names is None and hasattr(dataset, "take"):  # a datasets.IterableDataset whose features are unknown
        names = list(next(iter(dataset), {}))
    if names is None:
        raise TypeError(f"expected a datasets.Dataset with named columns, got {type(dataset).__name__}")
    return list(names)


def require_columns(dataset: Any, options: list[tuple[str, ...]], owner: str, arg: str) -> tuple[str, ...]:
    """Return the first column set in `options` that `dataset` has, else raise naming all of them."""
    return require_columns_in(columns_of(dataset), options, owner, arg)


def require_columns_in(
    names: list[str], options: list[tuple[str, ...]], owner: str, arg: str
) -> tuple[str, ...]:
    """`require_columns` on a list of column names."""
    have = set(names)
    for option in options:
        if set(option) <= have:
            return option
    wanted = " or ".join("(" + ", ".join(o) + ")" for o in options)
    raise ValueError(f"{owner}: `{arg}` needs the columns {wanted}; it has {sorted(have)}")


# --- chat data ----------------------------------------------------------------------------------------


def is_conversational(value: Any) -> bool:
    """True for a list of {"role": ..., "content": ...} messages (an assistant turn may carry `tool_calls`
    in place of content)."""
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(m, dict) and "role" in m and ("content" in m or "tool_calls" in m) for m in value)
    )


def row_tools(example: dict) -> list | None:
    """A row's `tools` column (the tool schemas the chat template renders), parsed when stored as JSON."""
    tools = example.get("tools")
    if isinstance(tools, str):
        import json

        tools = json.loads(tools)
    return tools or None


def row_chat_kwargs(example: dict) -> dict:
    """What a row adds to its chat template call: its `tools`, and its `chat_template_kwargs` (a dict of
    template variables, TRL 1.x's per-row column)."""
    kwargs = dict(example.get("chat_template_kwargs") or {})
    tools = row_tools(example)
    if tools:
        kwargs["tools"] = tools
    return kwargs


def render_chat(
    tokenizer: Any,
    messages: list[dict],
    add_generation_prompt: bool = False,
    tools: list | None = None,
    **template_kwargs: Any,
) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the dataset is conversational (lists of role/content messages) but the tokenizer has no "
            "chat_template; set tokenizer.chat_template or give plain text columns"
        )
    extra = {"tools": tools} if tools else {}  # only when given: older templates take no `tools`
    extra.update(template_kwargs)
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
    )


def split_prompt_completion_text(
    tokenizer: Any,
    prompt: list[dict],
    completion: list[dict],
    tools: list | None = None,
    **template_kwargs: Any,
) -> tuple[str, str]:
    """Render prompt messages (+ generation prompt) and the remaining completion text of the full chat."""
    kw = {"tools": tools, **template_kwargs}
    prompt_text = render_chat(tokenizer, prompt, add_generation_prompt=True, **kw)
    full_text = render_chat(tokenizer, prompt + completion, **kw)
    if not full_text.startswith(prompt_text):
        # some templates render the generation prompt differently from a real assistant turn
        prompt_text = render_chat(tokenizer, prompt, **kw)
        if not full_text.startswith(prompt_text):
            raise ValueError(
                "the chat template does not render the prompt as a prefix of prompt + completion"
            )
    return prompt_text, full_text[len(prompt_text) :]


def as_prompt_completion(
    example: dict, tokenizer: Any, completion_key: str = "completion"
) -> tuple[str, str]:
    """(prompt_text, completion_text) for a row holding `prompt` and `completion_key`, text or chat."""
    prompt, completion = example.get("prompt", ""), example[completion_key]
    if is_conversational(completion):
        return split_prompt_completion_text(
            tokenizer, list(prompt or []), list(completion), **row_chat_kwargs(example)
        )
    if not isinstance(completion, str) or not isinstance(prompt or "", str):
        raise ValueError(
            f"column {completion_key!r} must hold strings or lists of role/content messages, got "
            f"{type(completion).__name__}"
        )
    return prompt or "", completion


def example_to_text(
    example: dict, tokenizer: Any, dataset_text_field: str | None, formatting_func: Callable | None
) -> str:
    """One text per row: formatting_func, a `messages` chat, the text field, or prompt+completion."""
    if formatting_func is not None:
        text = formatting_func(example)
        if isinstance(text, list) and len(text) == 1:
            text = text[0]
        if not isinstance(text, str):
            raise ValueError(
                f"formatting_func must return a string for one example, got {type(text).__name__}"
            )
        return text
    if "messages" in example and is_conversational(example["messages"]):
        return render_chat(tokenizer, example["messages"], **row_chat_kwargs(example))
    if dataset_text_field and dataset_text_field in example:
        value = example[dataset_text_field]
        if is_conversational(value):
            return render_chat(tokenizer, value, **row_chat_kwargs(example))
        if not isinstance(value, str):
            raise ValueError(f"column {dataset_text_field!r} must hold strings, got {type(value).__name__}")
        return value
    if "prompt" in example and "completion" in example:
        prompt, completion = as_prompt_completion(example, tokenizer)
        return prompt + completion
    raise ValueError(
        f"cannot find the training text: no formatting_func, and the row has neither the dataset_text_field "
        f"{dataset_text_field!r}, nor 'messages', nor 'prompt'+'completion' (columns: {sorted(example)})"
    )


def with_eos(ids: list[int], eos_token_id: int | None) -> list[int]:
    if eos_token_id is None or (ids and ids[-1] == eos_token_id):
        return list(ids)
    return list(ids) + [eos_token_id]


# --- SFT ------------------------------------------------------------------------------------------------


def row_is_chat(example: dict, dataset_text_field: str | None = None) -> bool:
    """True when the row's text comes from the chat template (which then decides where EOS goes)."""
    keys = ("messages", "completion", "chosen", dataset_text_field)
    return any(k in example and is_conversational(example[k]) for k in keys if k)


def to_chatml(example: dict) -> dict:
    """TRL's ShareGPT form, a `conversations` column of {"from", "value"} messages, as `messages` of
    {"role", "content"}; the other columns of the row, and rows already in that form, are unchanged."""
    renamed = {"conversations": "messages"}
    out = {}
    for key, value in example.items():
        if isinstance(value, list) and value and all(isinstance(m, dict) and "from" in m for m in value):
            value = [{"role": m["from"], "content": m["value"]} for m in value]
        out[renamed.get(key, key)] = value
    return out


def _assistant_row(example: dict, tokenizer: Any, completion_only: bool) -> tuple[list[int], list[int]]:
    if "messages" in example and is_conversational(example["messages"]):
        return assistant_token_mask(tokenizer, example["messages"], **row_chat_kwargs(example))
    if is_conversational(example.get("completion")):
        kw = row_chat_kwargs(example)
        ids, mask = assistant_token_mask(
            tokenizer, list(example.get("prompt") or []) + example["completion"], **kw
        )
        if completion_only:  # the completion part only, as well
            prompt = tokenizer.apply_chat_template(
                list(example.get("prompt") or []),
                tokenize=True,
                add_generation_prompt=True,
                return_dict=True,
                **kw,
            )["input_ids"]
            mask = [0] * len(prompt) + mask[len(prompt) :]
        return ids, mask
    raise ValueError(
        "assistant_only_loss=True needs conversational rows: a 'messages' (or 'conversations') column, or "
        "'prompt'/'completion' lists of role/content messages"
    )


def _completion_row(example: dict, tokenizer: Any, eos: int | None) -> tuple[list[int], list[int]]:
    if "messages" in example and is_conversational(example["messages"]):
        messages = example["messages"]
        if messages[-1].get("role") != "assistant":
            raise ValueError(
                "completion_only_loss needs the last message of each conversation to be 'assistant'"
            )
        kwargs = row_chat_kwargs(example)
        prompt, completion = split_prompt_completion_text(tokenizer, messages[:-1], messages[-1:], **kwargs)
    elif "prompt" in example and "completion" in example:
        prompt, completion = as_prompt_completion(example, tokenizer)
    else:
        raise ValueError(
            "completion_only_loss needs 'prompt'+'completion' columns or a 'messages' chat column"
        )
    prompt_ids = tokenizer(prompt)["input_ids"] if prompt else []
    completion_ids = with_eos(tokenizer(completion, add_special_tokens=False)["input_ids"], eos)
    return prompt_ids + completion_ids, [0] * len(prompt_ids) + [1] * len(completion_ids)


def truncate(values: list, limit: int | None, mode: str = "keep_start") -> list:
    """The first (keep_start) or last (keep_end) `limit` items of `values`; all of them for None."""
    if limit is None or len(values) <= limit:
        return list(values)
    return list(values[:limit] if mode == "keep_start" else values[-limit:])


def _sft_row(example: dict, tokenizer: Any, args: dict) -> dict:
    """input_ids (+EOS for plain text) and labels (-100 where the loss does not train), truncated."""
    if args["formatting_func"] is None:  # a formatting function sees the row as it is
        example = to_chatml(example)
    chat = args["formatting_func"] is None and row_is_chat(example, args["dataset_text_field"])
    eos = None if chat else tokenizer.eos_token_id
    if args.get("assistant_only_loss"):
        ids, mask = _assistant_row(example, tokenizer, bool(args["completion_only_loss"]))
    elif args["completion_only_loss"]:
        ids, mask = _completion_row(example, tokenizer, eos)
    else:
        text = example_to_text(example, tokenizer, args["dataset_text_field"], args["formatting_func"])
        ids = with_eos(tokenizer(text)["input_ids"], eos)
        mask = [1] * len(ids)
    limit, mode = args["max_seq_length"], args.get("truncation_mode", "keep_start")
    return {
        "input_ids": truncate(ids, limit, mode),
        "labels": truncate(masked_labels(ids, [mask]), limit, mode),
    }


def masked_labels(input_ids: list[int], masks: list[list[int]]) -> list[int]:
    """The ids, with -100 wherever any of the masks is 0 (a token the loss does not train on)."""
    for mask in masks:
        if len(mask) != len(input_ids):
            raise ValueError(
                f"a mask of length {len(mask)} does not match input_ids of length {len(input_ids)}"
            )
    return [t if all(m[i] for m in masks) else IGNORE_INDEX for i, t in enumerate(input_ids)]


def _sft_batch(batch: dict, tokenizer: Any, args: dict) -> dict:
    rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
    done = [_sft_row(row, tokenizer, args) for row in rows]
    return {"input_ids": [d["input_ids"] for d in done], "labels": [d["labels"] for d in done]}


def _tokenised_row(example: dict, mask_columns: list[str], limit: int | None, mode: str) -> dict:
    """A caller-tokenised row: labels built from its mask columns (unless given), then cut to `limit`."""
    labels = example.get("labels")
    if labels is None:
        masks = [example[c] for c in mask_columns if example.get(c) is not None]
        labels = masked_labels(list(example["input_ids"]), masks)
    out = {"input_ids": truncate(example["input_ids"], limit, mode), "labels": truncate(labels, limit, mode)}
    if example.get("attention_mask") is not None:
        out["attention_mask"] = truncate(example["attention_mask"], limit, mode)
    return out


def is_iterable_dataset(dataset: Any) -> bool:
    """A `datasets.IterableDataset`: no len(), no random access, and no num_proc in its map."""
    return type(dataset).__name__ == "IterableDataset" and hasattr(dataset, "map")


def dataset_columns(dataset: Any) -> list[str]:
    """Column names; an iterable dataset whose features are unknown is asked for its first row."""
    names = getattr(dataset, "column_names", None)
    if names is None and is_iterable_dataset(dataset):
        names = list(next(iter(dataset)).keys())
    if names is None:
        raise TypeError(f"expected a datasets.Dataset with named columns, got {type(dataset).__name__}")
    return list(names)


def prepare_sft_dataset(
    dataset: Any,
    tokenizer: Any,
    max_seq_length: int | None,
    dataset_text_field: str | None = "text",
    formatting_func: Callable | None = None,
    completion_only_loss: bool | None = False,
    num_proc: int | None = None,
    batch_size: int | None = 1000,
    owner: str = "SFTTrainer",
    arg: str = "train_dataset",
    assistant_only_loss: bool = False,
    truncation_mode: str = "keep_start",
):
    """Tokenise an SFT dataset (`datasets.Dataset` or `IterableDataset`) into `input_ids` + `labels` (-100 =
    not trained on, as TRL 1.x prepares them), cut to `max_seq_length` by `truncation_mode`.

    completion_only_loss None: on for prompt/completion data. Pre-tokenised rows keep their `labels`, or get
    them from their `assistant_masks` and (unless completion_only_loss=False) `completion_mask`. Rows left
    with no trained token (all prompt after truncation) are dropped.
    """
    check_not_empty(dataset, owner, arg)
    names = dataset_columns(dataset)
    if "input_ids" in names:
        masks = [c for c in ("completion_mask", "assistant_masks") if c in names]
        if completion_only_loss is False and "completion_mask" in masks:
            masks.remove("completion_mask")
        kwargs = {"mask_columns": masks, "limit": max_seq_length, "mode": truncation_mode}
        out = dataset.map(_tokenised_row, fn_kwargs=kwargs, remove_columns=names)
        return _drop_untrained(out, dataset, owner, arg)
    if completion_only_loss is None:
        completion_only_loss = "prompt" in names and "completion" in names
    if formatting_func is None and not completion_only_loss and not assistant_only_loss:
        require_columns_in(
            names,
            [(dataset_text_field or "text",), ("messages",), ("conversations",), ("prompt", "completion")],
            owner,
            arg,
        )
    args = {
        "completion_only_loss": completion_only_loss,
        "assistant_only_loss": assistant_only_loss,
        "dataset_text_field": dataset_text_field,
        "formatting_func": formatting_func,
        "max_seq_length": max_seq_length,
        "truncation_mode": truncation_mode,
    }
    iterable = is_iterable_dataset(dataset)
    map_kwargs = {} if iterable else {"num_proc": num_proc}
    out = dataset.map(
        _sft_batch,
        fn_kwargs={"tokenizer": tokenizer, "args": args},
        batched=True,
        batch_size=batch_size if batch_size and batch_size > 0 else (1000 if iterable else None),
        remove_columns=names,
        **map_kwargs,
    )
    return _drop_untrained(out, dataset, owner, arg)


def _drop_untrained(out: Any, dataset: Any, owner: str, arg: str) -> Any:
    """`out` without the rows whose labels are all -100 (counted and logged for a map-style dataset)."""
    out = out.filter(lambda row: any(t != IGNORE_INDEX for t in row["labels"]))
    if not is_iterable_dataset(dataset):
        if len(out) < len(dataset):
            logger.warning(
                "%s: dropped %d examples left with no trained token after truncation to max_seq_length",
                owner,
                len(dataset) - len(out),
            )
        check_not_empty(out, owner, arg + " (after dropping rows with no trained token)")
    return out
