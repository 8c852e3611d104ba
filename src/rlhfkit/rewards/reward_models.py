"""A reward model given by its folder: the model, and the tokenizer it reads text with.

A folder that ships a tokenizer is scored on prompt + completion re-encoded with that tokenizer
(`RewardScorer`'s `reward_processing_class`), as TRL and `rlhfkit judge` do: the policy's token ids mean
nothing to a model trained on another vocabulary. One without a tokenizer reads the policy's token ids;
`check_reward_vocab` refuses it when its vocabulary is smaller than the policy tokenizer's. Every entry
point that takes a reward model path loads it here: GRPO's `reward_funcs` (and `rlhfkit grpo
--reward_model_name_or_path`), `rlhfkit rloo --reward_model_path`, `rlhfkit ppo --reward`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def folder_tokenizer(
    path: str | os.PathLike, trust_remote_code: bool = False, padding_side: str | None = None
) -> Any | None:
    """The tokenizer saved with the model at `path` (pad token: eos when it has none), or None when it has
    none. `path` is a folder, or a model name ("org/name") read from the local hub cache, as TRL loads a
    reward model's tokenizer from its name."""
    from transformers import AutoTokenizer

    from rlhfkit.data.loading import is_model_name

    folder = Path(path).expanduser()
    options = {"trust_remote_code": trust_remote_code}
    if padding_side is not None:
        options["padding_side"] = padding_side
    if not folder.exists() and is_model_name(str(path)):
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path), **options)
        except OSError:  # not cached, or a cached model without tokenizer files
            return None
    elif any((folder / name).is_file() for name in TOKENIZER_FILES):
        tokenizer = AutoTokenizer.from_pretrained(folder, **options)
    else:
        return None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_reward_model(path: str | os.PathLike, **from_pretrained_kwargs: Any) -> tuple[nn.Module, Any | None]:
    """(the one-output sequence-classification model in folder `path`, its own tokenizer or None)."""
    from transformers import AutoModelForSequenceClassification

    kwargs = {"num_labels": 1, **from_pretrained_kwargs}
    model = AutoModelForSequenceClassification.from_pretrained(path, **kwargs)
    return model, folder_tokenizer(path, bool(kwargs.get("trust_remote_code", False)))


def _vocab_size(model: nn.Module) -> int | None:
    try:
        embeddings = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        embeddings = None
    size = getattr(embeddings, "num_embeddings", None)
    return size if size is not None else getattr(getattr(model, "config", None), "vocab_size", None)


def check_reward_vocab(model: nn.Module, policy_tokenizer: Any, name: str = "reward model") -> None:
    """Raise when `model`, which is to read the policy's token ids, has fewer embeddings than the policy's
    tokenizer has tokens (an id past its table would fail with a bare IndexError mid-run)."""
    try:
        policy_vocab = len(policy_tokenizer)
    except TypeError:
        return
    reward_vocab = _vocab_size(model)
    if reward_vocab is not None and reward_vocab < policy_vocab:
        raise ValueError(
            f"{name} has a vocabulary of {reward_vocab} tokens, smaller than the policy tokenizer's "
            f"{policy_vocab}: it cannot read the policy's token ids. Give it its own tokenizer: save the "
            "tokenizer it was trained with in its folder, or pass it as reward_processing_class(es)"
        )
