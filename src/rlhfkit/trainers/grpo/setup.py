"""How GRPOTrainer sets itself up: its reward sources, its prompt datasets and its sampling parameters."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AutoModelForSequenceClassification

from rlhfkit.rewards.reward_models import folder_tokenizer
from rlhfkit.rollout import SamplingParams
from rlhfkit.trainers.common.prompts import check_prompts, datasets_by_argument, tokenize_datasets
from rlhfkit.trainers.common.trainer_setup import load_model
from rlhfkit.trainers.grpo.prompt_stream import is_stream

OWNER = "GRPOTrainer"


def default_output_dir(model: Any, owner: str = OWNER) -> str:
    """`<model name>-GRPO` (`-RLOO` for RLOOTrainer), after the last part of the model's path or hub name."""
    name = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", "")
    return f"{str(name or 'model').rstrip('/').split('/')[-1]}-{owner.removesuffix('Trainer')}"


def reward_sources(
    reward_funcs: Any, init_kwargs: dict | None, processing_classes: Any = None, owner: str = OWNER
) -> tuple[list, list[str], list]:
    """The reward functions and models (a local path is loaded as a one-output classifier), their names,
    and one reward processing class per source: `processing_classes` (None, one tokenizer for a single
    source, or a list as long as `reward_funcs`) with each path's own tokenizer filled in where none was
    given (`rewards.reward_models`). None in the list: a callable, or a model reading the policy's ids."""
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not funcs:
        raise ValueError(f"{owner}: reward_funcs is empty; give at least one reward function or model")
    tokenizers = _one_per_source(processing_classes, len(funcs), owner)
    sources, names = [], []
    for i, func in enumerate(funcs):
        if isinstance(func, str):
            kwargs = {**(init_kwargs or {}), "num_labels": 1}
            path, func = func, load_model(func, AutoModelForSequenceClassification, kwargs, owner)
            if tokenizers[i] is None:
                tokenizers[i] = folder_tokenizer(path, bool(kwargs.get("trust_remote_code", False)))
        if isinstance(func, nn.Module):
            names.append(
                str(getattr(func.config, "_name_or_path", "") or type(func).__name__)
                .rstrip("/")
                .split("/")[-1]
            )
        elif callable(func):
            names.append(getattr(func, "__name__", None) or type(func).__name__)
        else:
            raise TypeError(
                f"{owner}: reward_funcs must hold callables, models or model paths, got {type(func).__name__}"
            )
        sources.append(func)
    return sources, names, tokenizers


def _one_per_source(processing_classes: Any, n: int, owner: str) -> list:
    """`reward_processing_classes` as a list of `n` (None: n Nones; one tokenizer: a list of one)."""
    if processing_classes is None:
        return [None] * n
    given = (
        list(processing_classes) if isinstance(processing_classes, (list, tuple)) else [processing_classes]
    )
    if len(given) != n:
        raise ValueError(
            f"{owner}: reward_processing_classes has {len(given)} entries for {n} reward functions; the "
            "counts must match (one per entry of reward_funcs, None for a reward function)"
        )
    return given


def _truncate_prompts(dataset: Any, max_length: int | None) -> Any:
    """Keep the last `max_length` tokens of longer prompts (as TRL did)."""
    if dataset is None or not max_length or max(len(ids) for ids in dataset["input_ids"]) <= max_length:
        return dataset
    return dataset.map(lambda row: {"input_ids": row["input_ids"][-max_length:]}, desc="truncating prompts")


def prepare_datasets(train_dataset, eval_dataset, tokenizer, args, models) -> tuple[Any, Any]:
    """The prompt datasets tokenised (every other column kept), truncated to `max_prompt_length` and
    checked against the context of each of `models` (name -> model). A streamed train set (`IterableDataset`)
    is left as it is: its rows are prepared as they are drawn (`prompt_stream.stream_preparer`)."""
    stream = train_dataset if is_stream(train_dataset) else None
    _check_streams(stream, eval_dataset, args)
    train_dataset, eval_dataset = tokenize_datasets(
        None if stream is not None else train_dataset, eval_dataset, tokenizer, None, keep_columns=True,
        chat_template_kwargs=args.chat_template_kwargs,
    )  # fmt: skip
    if stream is not None:
        train_dataset = None  # left out of the checks below
    train_dataset = _truncate_prompts(train_dataset, args.max_prompt_length)
    if isinstance(eval_dataset, dict):
        eval_dataset = {k: _truncate_prompts(v, args.max_prompt_length) for k, v in eval_dataset.items()}
    else:
        eval_dataset = _truncate_prompts(eval_dataset, args.max_prompt_length)
    for what, dataset in datasets_by_argument(train_dataset, eval_dataset).items():
        if dataset is not None:
            check_prompts(dataset, what, args.max_completion_length, models)
    return (stream if stream is not None else train_dataset), eval_dataset


def _check_streams(stream: Any, eval_dataset: Any, args: Any) -> None:
    """A streamed train set needs `max_steps` (it has no length); evaluation sets must have one."""
    if stream is not None and args.max_steps <= 0:
        raise ValueError(
            "train_dataset is an IterableDataset, which has no length: set max_steps (> 0) to say how many "
            f"updates to train for (got max_steps={args.max_steps})"
        )
    evals = eval_dataset.values() if isinstance(eval_dataset, dict) else [eval_dataset]
    if any(is_stream(ds) for ds in evals):
        raise ValueError(
            "eval_dataset must be a datasets.Dataset (or a dict of them), not an IterableDataset: evaluation "
            "scores every prompt; stream only the train_dataset"
        )


def sampling_params(args: Any, tokenizer: Any) -> SamplingParams:
    """The sampling options of `args`; a value given again in `generation_kwargs` wins."""
    named = dict(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
    )
    extra = dict(args.generation_kwargs or {})
    if getattr(args, "cache_implementation", None) is not None:  # generation_kwargs win here too
        extra.setdefault("cache_implementation", args.cache_implementation)
    named.update({k: extra.pop(k) for k in list(extra) if k in named})  # generation_kwargs win
    stops = None if tokenizer.eos_token_id is None else (tokenizer.eos_token_id,)
    return SamplingParams(args.max_completion_length, stop_token_ids=stops, extra=extra, **named)


class Float32Head(nn.Linear):
    """An output projection whose float32 weights give float32 logits from any hidden states, autocast or
    not (ScaleRL's recipe: a low-precision head distorts the logprobs of the importance ratio)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.float()
            return nn.functional.linear(hidden.float(), self.weight.float(), bias)


def cast_lm_head_to_fp32(model: nn.Module, owner: str = OWNER) -> None:
    """Make `model`'s output projection a `Float32Head` in float32, in place (state-dict keys unchanged).

    A head tied to the input embeddings shares its weight: the embeddings become float32 too, and their
    output is cast back to the model's dtype so the rest of the network is unchanged. The chunked
    log-prob path does not take such a head: logprobs then come from full logits (more memory).
    """
    head = model.get_output_embeddings()
    if type(head) is Float32Head:  # already cast (a PEFT policy is its own reference)
        return
    if type(head) is not nn.Linear:  # a PEFT layer on the head, or an exotic projection
        raise ValueError(
            f"{owner}: cast_lm_head_to_fp32 needs a plain nn.Linear output projection, got "
            f"{type(head).__name__} (a PEFT adapter on lm_head? remove 'lm_head' from its target_modules)"
        )
    dtype, embeddings = head.weight.dtype, model.get_input_embeddings()
    head.float()
    head.__class__ = Float32Head
    if embeddings is not None and embeddings.weight is head.weight and dtype != torch.float32:
        embeddings.register_forward_hook(lambda module, inputs, output: output.to(dtype))
