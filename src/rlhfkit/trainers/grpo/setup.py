"""How GRPOTrainer sets itself up: its reward sources, its prompt datasets and its sampling parameters."""

from __future__ import annotations

from typing import Any

import torch
from datasets import Dataset
from torch import nn
from transformers import AutoModelForSequenceClassification

from rlhfkit.data.chat_templates import apply_chat_template_path
from rlhfkit.models.reference import choose_reference
from rlhfkit.rewards.reward_models import folder_tokenizer
from rlhfkit.rollout import SamplingParams
from rlhfkit.trainers.common.prompts import check_prompts, tokenize_prompts
from rlhfkit.trainers.common.trainer_setup import load_model
from rlhfkit.trainers.grpo.prompt_stream import is_stream

OWNER = "GRPOTrainer"


def default_output_dir(model: Any, owner: str = OWNER) -> str:
    """`<model name>-GRPO` (`-RLOO` for RLOOTrainer), after the last part of the model's path or hub name."""
    name = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", "")
    return f"{str(name or 'model').rstrip('/').split('/')[-1]}-{owner.removesuffix('Trainer')}"


def prepare_tokenizer(tokenizer: Any, args: Any, owner: str = OWNER) -> None:
    """Check the policy's tokenizer is there, pad with its eos token when it has no pad token, and put in
    the chat template of `chat_template_path` (when set)."""
    if tokenizer is None:
        raise ValueError(f"{owner}: processing_class (the tokenizer) is required when model is not a path")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    apply_chat_template_path(tokenizer, getattr(args, "chat_template_path", None), owner)


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


def prepare_datasets(train_dataset, eval_dataset, tokenizer, args, models) -> tuple[Any, dict]:
    """The train set tokenised (every other column kept), truncated to `max_prompt_length` and checked
    against the context of each of `models` (name -> model), and each map-style evaluation set prepared the
    same way, by name (None for a single set). Streams (`IterableDataset`) are left as they are: the train
    stream's rows are prepared as they are drawn (`prompt_stream.stream_preparer`), an evaluation stream's
    when `evaluate` reads it."""
    if train_dataset is None:
        raise ValueError("`train_dataset` is required: the prompts to sample completions for (got None)")
    stream = train_dataset if is_stream(train_dataset) else None
    _settle_stream(stream, args)
    if stream is None:
        train_dataset = tokenize_prompts(train_dataset, tokenizer, None, "train_dataset", **_options(args))
        train_dataset = _truncate_prompts(train_dataset, args.max_prompt_length)
        check_prompts(train_dataset, "train_dataset", args.max_completion_length, models)
    parts = eval_dataset.items() if isinstance(eval_dataset, dict) else [(None, eval_dataset)]
    if isinstance(eval_dataset, dict) and not eval_dataset:
        raise ValueError("eval_dataset is an empty dict; give at least one named dataset, or None")
    evals = {
        name: prepare_eval_set(part, tokenizer, args, models, name)
        for name, part in parts
        if part is not None and not is_stream(part)
    }
    return (stream if stream is not None else train_dataset), evals


def prepare_eval_set(dataset: Any, tokenizer: Any, args: Any, models: dict, name: str | None = None) -> Any:
    """One evaluation set tokenised, truncated and checked like the train set; a stream is read whole first
    (evaluation scores every prompt, so it must end)."""
    if is_stream(dataset):
        dataset = Dataset.from_list(list(dataset))
    what = "eval_dataset" if name is None else f"eval_dataset[{name!r}]"
    prepared = tokenize_prompts(dataset, tokenizer, None, what, **_options(args))
    prepared = _truncate_prompts(prepared, args.max_prompt_length)
    check_prompts(prepared, what, args.max_completion_length, models)
    return prepared


def _options(args: Any) -> dict:
    """How prompts are tokenised: every other column kept (for the reward functions), the chat options."""
    return {"keep_columns": True, "chat_template_kwargs": args.chat_template_kwargs}


def _settle_stream(stream: Any, args: Any) -> None:
    """A streamed train set needs `max_steps` (it has no length), and is read by each process itself: no
    dispatched batches, no dataloader workers (`args` is set so, as TRL does)."""
    if stream is None:
        return
    if args.max_steps <= 0:
        raise ValueError(
            "train_dataset is an IterableDataset, which has no length: set max_steps (> 0) to say how many "
            f"updates to train for (got max_steps={args.max_steps})"
        )
    accelerator_config = getattr(args, "accelerator_config", None)
    if getattr(accelerator_config, "dispatch_batches", None):
        raise ValueError(
            "accelerator_config.dispatch_batches=True does not go with a streamed train_dataset: every "
            "process reads its own share of the stream; set dispatch_batches to False (or leave it unset)"
        )
    if accelerator_config is not None:
        accelerator_config.dispatch_batches = False
    args.dataloader_num_workers = 0


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


def build_reference(policy: nn.Module, args: Any, owner: str = OWNER) -> Any:
    """The KL reference (`choose_reference`), in `ref_model_dtype`; None with beta = 0 (no copy, no adapter
    switching)."""
    if args.beta == 0:
        return None
    reference = choose_reference(policy)
    if reference.kind != "model" and (args.sync_ref_model or args.ref_model_dtype is not None):
        what = "sync_ref_model mixes" if args.sync_ref_model else "ref_model_dtype casts"
        raise ValueError(
            f"{owner}: {what} a frozen-copy reference; a PEFT policy's reference is its own base weights"
        )
    if args.ref_model_dtype is not None:
        reference.model.to(getattr(torch, args.ref_model_dtype))
    return reference
