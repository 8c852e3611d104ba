"""Input checks and batching for `PPOTrainer`: catch bad step() arguments before any forward pass.

`step(queries, responses, scores)` takes Python lists (one entry per sample), as the seeds document;
these helpers validate them and name the offending argument and index in every error.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rlhfkit.trainers.common.guards import NonFiniteStepWarning


def _as_list(value: Any, name: str) -> list:
    if isinstance(value, torch.Tensor):
        if name == "scores" and value.dim() == 1:
            return list(value.unbind(0))  # a (B,) tensor of scores is accepted as B scalars
        raise TypeError(
            f"{name} must be a list of tensors (one per sample), got a tensor of shape {tuple(value.shape)}; "
            f"use list({name}) or [t for t in {name}]"
        )
    if not isinstance(value, list | tuple):
        raise TypeError(f"{name} must be a list of tensors (one per sample), got {type(value).__name__}")
    return list(value)


def _check_device(tensor: torch.Tensor, name: str, device: torch.device) -> torch.Tensor:
    """CPU tensors (what dataloaders yield) are moved; a tensor on another accelerator is an error."""
    if tensor.device.type == "meta":
        raise ValueError(f"{name} is on the meta device (it holds no data)")
    if tensor.device != device and tensor.device.type != "cpu":
        raise ValueError(f"{name} is on {tensor.device} but the trainer runs on {device}; move it first")
    return tensor.to(device)


def _check_token_tensor(tensor: Any, name: str, device: torch.device) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(tensor).__name__}")
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {tensor.dtype}")
    if tensor.dim() == 2 and tensor.shape[0] == 1:
        tensor = tensor[0]  # a (1, L) row, as tokenizer(..., return_tensors='pt') gives
    if tensor.dim() != 1:
        raise ValueError(f"{name} must be 1-D (sequence_length,), got shape {tuple(tensor.shape)}")
    if tensor.numel() == 0:
        raise ValueError(f"{name} is empty; every sample needs at least one token")
    return _check_device(tensor, name, device).long()


def _check_score(score: Any, name: str, device: torch.device) -> torch.Tensor:
    if isinstance(score, int | float) and not isinstance(score, bool):
        score = torch.tensor(float(score))
    if not isinstance(score, torch.Tensor):
        raise TypeError(f"{name} must be a scalar tensor (or a float), got {type(score).__name__}")
    if score.dtype == torch.bool or score.dtype.is_complex:
        raise TypeError(f"{name} must be a real number, got dtype {score.dtype}")
    if score.numel() != 1 or score.dim() > 1:
        raise ValueError(
            f"{name} must be one number per sample (shape () or (1,)), got shape {tuple(score.shape)}; "
            "reduce it to a single score per response"
        )
    if score.device.type == "meta":
        raise ValueError(f"{name} is on the meta device (it holds no data)")
    value = score.detach().reshape(()).to(device=device, dtype=torch.float32)
    if not torch.isfinite(value):  # not an error: PPOTrainer.step skips the step (NonFiniteGuard)
        warnings.warn(
            f"{name} is {value.item()}; the step will be skipped", NonFiniteStepWarning, stacklevel=4
        )
    return value


def check_step_inputs(
    queries: Any,
    responses: Any,
    scores: Any,
    response_masks: Any,
    batch_size: int,
    device: torch.device,
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, list[torch.Tensor] | None]:
    """Validate step() arguments; returns (queries, responses, scores (B,) float32, response_masks)."""
    queries = _as_list(queries, "queries")
    responses = _as_list(responses, "responses")
    scores = _as_list(scores, "scores")
    lengths = {"queries": len(queries), "responses": len(responses), "scores": len(scores)}
    if response_masks is not None:
        response_masks = _as_list(response_masks, "response_masks")
        lengths["response_masks"] = len(response_masks)
    if len(set(lengths.values())) != 1:
        raise ValueError(
            f"queries, responses and scores must have one entry per sample; got lengths {lengths}"
        )
    if len(queries) != batch_size:
        raise ValueError(
            f"step() got {len(queries)} samples but config.batch_size is {batch_size}; "
            "pass exactly batch_size queries, responses and scores"
        )
    queries = [_check_token_tensor(q, f"queries[{i}]", device) for i, q in enumerate(queries)]
    responses = [_check_token_tensor(r, f"responses[{i}]", device) for i, r in enumerate(responses)]
    score_values = torch.stack([_check_score(s, f"scores[{i}]", device) for i, s in enumerate(scores)])
    if response_masks is not None:
        checked = []
        for i, (mask, response) in enumerate(zip(response_masks, responses)):
            name = f"response_masks[{i}]"
            if not isinstance(mask, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
            mask = mask.reshape(-1) if mask.dim() == 2 and mask.shape[0] == 1 else mask
            if mask.shape != response.shape:
                raise ValueError(
                    f"{name} has shape {tuple(mask.shape)} but responses[{i}] has {tuple(response.shape)}"
                )
            if not bool(((mask == 0) | (mask == 1)).all()):
                raise ValueError(f"{name} must contain only 0/1 (or bool) values")
            if not bool(mask.bool().any()):
                raise ValueError(
                    f"{name} masks out every token; each response needs at least one trained token"
                )
            checked.append(_check_device(mask, name, device).bool())
        response_masks = checked
    return queries, responses, score_values, response_masks


def as_token_tensor(query: Any, name: str) -> torch.Tensor:
    """A query for generate(): a 1-D tensor or a list of ints -> 1-D long tensor."""
    if isinstance(query, list | tuple) and all(isinstance(t, int) for t in query):
        query = torch.tensor(list(query), dtype=torch.long)
    if not isinstance(query, torch.Tensor):
        raise TypeError(
            f"{name} must be a 1-D tensor of token ids (or a list of ints), got {type(query).__name__}"
        )
    if query.dtype.is_floating_point or query.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {query.dtype}")
    if query.dim() == 2 and query.shape[0] == 1:
        query = query[0]
    if query.dim() != 1 or query.numel() == 0:
        raise ValueError(
            f"{name} must be a non-empty 1-D tensor of token ids, got shape {tuple(query.shape)}"
        )
    return query.long()


def ppo_collator(features: Sequence[dict[str, Any]]) -> dict[str, list]:
    """Batch dataset rows into lists, one entry per sample (queries may differ in length).

    Token-id columns stored as Python lists become 1-D long tensors, so `batch["input_ids"]` can go
    straight to `generate()` and `step()` without `dataset.set_format("torch")`. Rows that are not
    mappings (a dataset of `(query, response)` tuples, as in TRL's tests) get torch's default collation,
    which TRL's dataloader used.
    """
    if not isinstance(features[0], Mapping):
        return torch.utils.data.default_collate(list(features))
    batch: dict[str, list] = {key: [row[key] for row in features] for key in features[0]}
    for key in ("input_ids", "attention_mask"):
        if key in batch:
            batch[key] = [
                v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.long) for v in batch[key]
            ]
    return batch


DEFAULT_MAX_NEW_TOKENS = 20  # transformers' default generation length, used when nothing else is given


def generation_config_from_kwargs(base: Any, kwargs: dict[str, Any]) -> Any:
    """A copy of the model's generation config updated with TRL-style `generate()` keyword arguments.

    `min_length=-1` (the seed's "no minimum") is dropped, `top_k=0.0` becomes 0 (off); unknown
    settings raise. Without `max_new_tokens`, responses get at most DEFAULT_MAX_NEW_TOKENS tokens.
    """
    from transformers import GenerationConfig

    config = GenerationConfig.from_dict(base.to_dict()) if base is not None else GenerationConfig()
    kwargs = dict(kwargs)
    if kwargs.get("min_length") is not None and kwargs["min_length"] < 0:
        kwargs.pop("min_length")
    if kwargs.get("top_k") is not None:
        kwargs["top_k"] = int(kwargs["top_k"])
    unknown = config.update(**kwargs)
    if unknown:
        raise ValueError(f"generate() got unknown generation settings {sorted(unknown)}")
    if config.max_new_tokens is None:
        config.max_new_tokens = DEFAULT_MAX_NEW_TOKENS
    return config


def responses_repeat_queries(queries: Sequence[torch.Tensor], responses: Sequence[torch.Tensor]) -> bool:
    """True when every response begins with its own query (generate()'s default return_prompt=True)."""
    return all(len(r) > len(q) and torch.equal(r[: len(q)], q) for q, r in zip(queries, responses))


def check_trainer_args(
    config: Any,
    model: Any,
    ref_model: Any,
    tokenizer: Any,
    dataset: Any,
    train_dataset: Any,
) -> tuple[Any, Any]:
    """Reject bad `PPOTrainer(...)` arguments before anything is built; returns (config, dataset)."""
    from torch import nn

    from rlhfkit.models.value_head import PreTrainedModelWrapper
    from rlhfkit.trainers.ppo.config import PPOConfig

    config = PPOConfig() if config is None else config
    if not isinstance(config, PPOConfig):
        raise TypeError(f"config must be a PPOConfig, got {type(config).__name__}")
    if not isinstance(model, PreTrainedModelWrapper):
        raise TypeError(
            "model must be a model with a value head (AutoModelForCausalLMWithValueHead or "
            f"AutoModelForSeq2SeqLMWithValueHead), got {type(model).__name__}; load it with "
            "AutoModelForCausalLMWithValueHead.from_pretrained(path)"
        )
    if ref_model is not None and not isinstance(ref_model, nn.Module):
        raise TypeError(f"ref_model must be a torch.nn.Module or None, got {type(ref_model).__name__}")
    if tokenizer is None or not hasattr(tokenizer, "pad_token_id"):
        raise TypeError("tokenizer must be a transformers tokenizer (PreTrainedTokenizerBase)")
    if dataset is not None and train_dataset is not None:
        raise ValueError("pass the prompts as dataset= or train_dataset=, not both")
    if dataset is None and train_dataset is None:
        warnings.warn(
            "no dataset given, so trainer.dataloader is None; each step() call must then bring exactly "
            f"config.batch_size={config.batch_size} samples (set config.batch_size to what you will pass)",
            UserWarning,
            stacklevel=3,
        )
    return config, (dataset if dataset is not None else train_dataset)
