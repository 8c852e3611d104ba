"""Prompts of the online trainers (RLOO, GRPO): tokenised and checked up front, then handed out in batches
in a resumable order.

The batch order is a pure function of (seed, update index): a resumed run needs no sampler state to
continue with exactly the prompts the uninterrupted run would have seen.
"""

from __future__ import annotations

from typing import Any

import torch

from rlhfkit.data.chat_templates import render_ids


def context_length(model: Any) -> int | None:
    """The most tokens `model` reads at once, from its config (None when it does not say)."""
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def prompt_ids(prompt: Any, tokenizer: Any, chat_template_kwargs: dict | None = None) -> list[int]:
    """The token ids of one prompt: text as is, chat messages through the chat template (generation prompt
    added)."""
    if isinstance(prompt, list):
        return render_ids(tokenizer, prompt, add_generation_prompt=True, **(chat_template_kwargs or {}))
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def tokenize_prompts(
    dataset: Any,
    tokenizer: Any,
    num_proc: int | None,
    what: str,
    keep_columns: bool = False,
    chat_template_kwargs: dict | None = None,
) -> Any:
    """A dataset with an "input_ids" column: kept as is, or built from a "prompt" column.

    A "prompt" may be a string or a list of chat messages (rendered with the tokenizer's chat template and
    `chat_template_kwargs`, e.g. `{"enable_thinking": False}`).
    `keep_columns` keeps the other columns next to "input_ids" (GRPO hands them to reward functions).
    """
    if dataset is None:
        raise ValueError(f"{what} is required")
    if not hasattr(dataset, "column_names"):
        raise TypeError(
            f"{what} must be a datasets.Dataset with a 'prompt' column, got {type(dataset).__name__}"
        )
    if len(dataset) == 0:
        raise ValueError(f"{what} is empty: at least one prompt is needed")
    columns = list(dataset.column_names)
    if "input_ids" in columns:
        return dataset
    if "prompt" not in columns:
        raise ValueError(
            f"{what} needs a 'prompt' column (text or chat messages) or a tokenised 'input_ids' column; "
            f"found columns {columns}"
        )

    def encode(row: dict) -> dict:
        return {"input_ids": prompt_ids(row["prompt"], tokenizer, chat_template_kwargs)}

    removed = [] if keep_columns else columns
    return dataset.map(encode, remove_columns=removed, num_proc=num_proc, desc=f"tokenising {what}")


def tokenize_datasets(
    train_dataset: Any,
    eval_dataset: Any,
    tokenizer: Any,
    num_proc: int | None,
    keep_columns: bool = False,
    chat_template_kwargs: dict | None = None,
) -> tuple[Any, Any]:
    """`tokenize_prompts` over the train set and the evaluation set(s): None, one dataset, or a dict by
    name. `train_dataset` None: the evaluation sets only (a streamed train set is tokenised as it is read)."""
    options = dict(keep_columns=keep_columns, chat_template_kwargs=chat_template_kwargs)
    if train_dataset is not None:
        train_dataset = tokenize_prompts(train_dataset, tokenizer, num_proc, "train_dataset", **options)
    if isinstance(eval_dataset, dict):  # named evaluation sets: one sample table each
        if not eval_dataset:
            raise ValueError("eval_dataset is an empty dict; give at least one named dataset, or None")
        eval_dataset = {
            name: tokenize_prompts(ds, tokenizer, num_proc, f"eval_dataset[{name!r}]", **options)
            for name, ds in eval_dataset.items()
        }
    elif eval_dataset is not None:
        eval_dataset = tokenize_prompts(eval_dataset, tokenizer, num_proc, "eval_dataset", **options)
    return train_dataset, eval_dataset


def datasets_by_argument(train_dataset: Any, eval_dataset: Any) -> dict[str, Any]:
    """Every dataset keyed by how an error should name it ("train_dataset", "eval_dataset['x']", ...)."""
    named = {"train_dataset": train_dataset}
    if isinstance(eval_dataset, dict):
        named.update({f"eval_dataset[{name!r}]": ds for name, ds in eval_dataset.items()})
    elif eval_dataset is not None:
        named["eval_dataset"] = eval_dataset
    return named


def check_prompts(dataset: Any, what: str, response_length: int, models: dict[str, Any]) -> None:
    """Raise before training when a prompt is empty or prompt + response exceeds a model's context."""
    lengths = [len(ids) for ids in dataset["input_ids"]]
    if min(lengths) == 0:
        raise ValueError(f"{what} row {lengths.index(0)} has an empty prompt")
    longest = max(lengths)
    for name, model in models.items():
        context = context_length(model)
        if context is not None and longest + response_length > context:
            raise ValueError(
                f"{what}: the longest prompt has {longest} tokens (row {lengths.index(longest)}); with "
                f"response_length={response_length} that exceeds the {context}-token context of the {name}. "
                "Shorten or filter the prompts, or lower response_length"
            )


class PromptSchedule:
    """Which dataset rows each process uses at each update: per-epoch shuffles (or the dataset's order,
    `shuffle=False`), last partial batch dropped."""

    def __init__(
        self,
        num_rows: int,
        prompts_per_process: int,
        num_processes: int,
        process_index: int,
        seed: int,
        shuffle: bool = True,
    ):
        self.global_batch = prompts_per_process * num_processes
        if num_rows < self.global_batch:
            raise ValueError(
                f"the train dataset has {num_rows} prompts but one update needs {self.global_batch} "
                f"({prompts_per_process} per process); use more prompts or a smaller batch"
            )
        self.num_rows, self.per_process, self.rank, self.seed = (
            num_rows,
            prompts_per_process,
            process_index,
            seed,
        )
        self.batches_per_epoch = num_rows // self.global_batch
        self.shuffle = shuffle

    def indices(self, update: int) -> list[int]:
        epoch, position = divmod(update, self.batches_per_epoch)
        if self.shuffle:
            order = torch.randperm(self.num_rows, generator=torch.Generator().manual_seed(self.seed + epoch))
        else:
            order = torch.arange(self.num_rows)
        start = position * self.global_batch + self.rank * self.per_process
        return order[start : start + self.per_process].tolist()
