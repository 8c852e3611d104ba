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
    have = set(columns_of(dataset))
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


def render_chat(
    tokenizer: Any, messages: list[dict], add_generation_prompt: bool = False, tools: list | None = None
) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the dataset is conversational (lists of role/content messages) but the tokenizer has no "
            "chat_template; set tokenizer.chat_template or give plain text columns"
        )
    extra = {"tools": tools} if tools else {}  # only when given: older templates take no `tools`
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
    )


def split_prompt_completion_text(
    tokenizer: Any, prompt: list[dict], completion: list[dict], tools: list | None = None
) -> tuple[str, str]:
    """Render prompt messages (+ generation prompt) and the remaining completion text of the full chat."""
    prompt_text = render_chat(tokenizer, prompt, add_generation_prompt=True, tools=tools)
    full_text = render_chat(tokenizer, prompt + completion, tools=tools)
    if not full_text.startswith(prompt_text):
        # some templates render the generation prompt differently from a real assistant turn
        prompt_text = render_chat(tokenizer, prompt, tools=tools)
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
        return split_prompt_completion_text(tokenizer, list(prompt or []), list(completion))
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
        return render_chat(tokenizer, example["messages"])
    if dataset_text_field and dataset_text_field in example:
        value = example[dataset_text_field]
        if is_conversational(value):
            return render_chat(tokenizer, value)
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


def _sft_row(example: dict, tokenizer: Any, args: dict) -> dict:
    """input_ids (+EOS for plain text, truncated) and completion_mask (1 = a token the loss trains on)."""
    eos = (
        None
        if args["formatting_func"] is None and row_is_chat(example, args["dataset_text_field"])
        else (tokenizer.eos_token_id)
    )
    if args["completion_only_loss"]:
        if "messages" in example and is_conversational(example["messages"]):
            messages = example["messages"]
            if messages[-1].get("role") != "assistant":
                raise ValueError(
                    "completion_only_loss needs the last message of each conversation to be 'assistant'"
                )
            prompt, completion = split_prompt_completion_text(tokenizer, messages[:-1], messages[-1:])
        elif "prompt" in example and "completion" in example:
            prompt, completion = as_prompt_completion(example, tokenizer)
        else:
            raise ValueError(
                "completion_only_loss needs 'prompt'+'completion' columns or a 'messages' chat column"
            )
        prompt_ids = tokenizer(prompt)["input_ids"] if prompt else []
        completion_ids = with_eos(tokenizer(completion, add_special_tokens=False)["input_ids"], eos)
        ids = prompt_ids + completion_ids
        mask = [0] * len(prompt_ids) + [1] * len(completion_ids)
    else:
        text = example_to_text(example, tokenizer, args["dataset_text_field"], args["formatting_func"])
        ids = with_eos(tokenizer(text)["input_ids"], eos)
        mask = [1] * len(ids)
    limit = args["max_seq_length"]
    return {"input_ids": ids[:limit], "completion_mask": mask[:limit]}


def _sft_batch(batch: dict, tokenizer: Any, args: dict) -> dict:
    rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
    done = [_sft_row(row, tokenizer, args) for row in rows]
    return {
        "input_ids": [d["input_ids"] for d in done],
        "completion_mask": [d["completion_mask"] for d in done],
    }


def prepare_sft_dataset(
    dataset: Any,
    tokenizer: Any,
    max_seq_length: int,
    dataset_text_field: str | None = "text",
    formatting_func: Callable | None = None,
    completion_only_loss: bool = False,
    num_proc: int | None = None,
    batch_size: int | None = 1000,
    owner: str = "SFTTrainer",
    arg: str = "train_dataset",
):
    """Tokenise an SFT dataset into `input_ids` + `completion_mask`; pre-tokenised data passes through."""
    check_not_empty(dataset, owner, arg)
    names = columns_of(dataset)
    if "input_ids" in names:
        extra = [c for c in names if c not in ("input_ids", "attention_mask", "completion_mask", "labels")]
        return dataset.remove_columns(extra)
    if formatting_func is None and not completion_only_loss:
        require_columns(
            dataset, [(dataset_text_field or "text",), ("messages",), ("prompt", "completion")], owner, arg
        )
    args = {
        "completion_only_loss": completion_only_loss,
        "dataset_text_field": dataset_text_field,
        "formatting_func": formatting_func,
        "max_seq_length": max_seq_length,
    }
    out = dataset.map(
        _sft_batch,
        fn_kwargs={"tokenizer": tokenizer, "args": args},
        batched=True,
        batch_size=batch_size if batch_size and batch_size > 0 else None,
        remove_columns=names,
        num_proc=num_proc,
    )
    if completion_only_loss:
        before = len(out)
        out = out.filter(lambda row: any(row["completion_mask"]))
        if len(out) < before:
            logger.warning(
                "%s: dropped %d examples whose completion was cut off by max_seq_length",
                owner,
                before - len(out),
            )
        check_not_empty(out, owner, arg + " (after dropping rows with no completion token)")
    return out
