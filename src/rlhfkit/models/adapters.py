"""Several LoRA adapters on one frozen base model: policy, reference and reward (multi-adapter RL).

One set of base weights serves three roles. The *policy* adapter is trained; the *reference* is the
base with adapters disabled, or a frozen adapter named `reference` when the policy started from an
already trained (SFT) LoRA, so the KL penalty is measured against the SFT model and not the bare base;
the *reward* adapter plus its score head (a LoRA trained as a sequence classifier on the same base)
scores completions. Switching is done with context managers that always restore the active adapter and
every parameter's `requires_grad`, even when the body raises.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhfkit.core.masking import position_ids_from_mask
from rlhfkit.models.eval_mode import eval_mode
from rlhfkit.models.peft_detection import peft_model_of

REFERENCE_ADAPTER_NAME = "reference"
_ADAPTER_CONFIG = "adapter_config.json"
_ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


def _require_adapter(peft_model: Any, adapter_name: str, argument: str) -> None:
    if adapter_name not in peft_model.peft_config:
        raise ValueError(
            f"{argument}={adapter_name!r} is not an adapter of this model; "
            f"loaded adapters: {sorted(peft_model.peft_config)}"
        )


@contextlib.contextmanager
def _keep_trainable_flags(module: nn.Module) -> Iterator[None]:
    # peft's set_adapter turns gradients on for the adapter it activates; undo that afterwards.
    flags = [(p, p.requires_grad) for p in module.parameters()]
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


@contextlib.contextmanager
def use_adapter(model: nn.Module, adapter_name: str, restore_adapter: str | None = None) -> Iterator[None]:
    """Activate `adapter_name` for the body, then activate `restore_adapter` (default: the one active before).

    Parameter `requires_grad` flags are restored as well, so a frozen adapter stays frozen and the
    policy adapter stays trainable. The restore happens even if the body raises.
    """
    peft_model = peft_model_of(model)
    if peft_model is None:
        raise ValueError("use_adapter needs a PEFT model (a PeftModel or a value-head wrapper around one)")
    _require_adapter(peft_model, adapter_name, "adapter_name")
    restore = restore_adapter if restore_adapter is not None else peft_model.active_adapter
    _require_adapter(peft_model, restore, "restore_adapter")
    with _keep_trainable_flags(peft_model):
        peft_model.set_adapter(adapter_name)
        try:
            yield
        finally:
            peft_model.set_adapter(restore)


def add_reference_adapter(
    model: nn.Module, source_adapter: str = "default", adapter_name: str = REFERENCE_ADAPTER_NAME
) -> None:
    """Keep a frozen copy of the (already trained) `source_adapter` as the reference adapter.

    Use when the policy is an SFT LoRA that RL keeps training: `reference.choose_reference` then picks
    the frozen SFT copy as the reference instead of the bare base model. Costs one adapter's memory.
    """
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    peft_model = peft_model_of(model)
    if peft_model is None:
        raise ValueError("add_reference_adapter needs a PEFT model")
    _require_adapter(peft_model, source_adapter, "source_adapter")
    if adapter_name in peft_model.peft_config:
        raise ValueError(f"adapter_name={adapter_name!r} already exists; choose another name")
    config = copy.deepcopy(peft_model.peft_config[source_adapter])
    config.inference_mode = True
    with _keep_trainable_flags(peft_model):
        peft_model.add_adapter(adapter_name, config)
        state = get_peft_model_state_dict(peft_model, adapter_name=source_adapter)
        set_peft_model_state_dict(peft_model, state, adapter_name=adapter_name)
    _freeze_adapter(peft_model, adapter_name)


def _freeze_adapter(peft_model: Any, adapter_name: str) -> None:
    marker = f".{adapter_name}."
    for name, param in peft_model.named_parameters():
        if marker in name or name.endswith(f".{adapter_name}"):
            param.requires_grad_(False)


def _resolve_adapter_dir(adapter: str | os.PathLike) -> Path:
    path = Path(adapter)
    if path.is_dir():
        if not (path / _ADAPTER_CONFIG).is_file():
            raise ValueError(f"reward_adapter={str(adapter)!r} is a folder without {_ADAPTER_CONFIG}")
        return path
    from huggingface_hub import snapshot_download  # a Hub id

    try:
        return Path(snapshot_download(str(adapter), allow_patterns=[_ADAPTER_CONFIG, *_ADAPTER_WEIGHTS]))
    except Exception as err:
        raise ValueError(
            f"reward_adapter={str(adapter)!r} is neither a local adapter folder "
            f"nor a reachable Hub repo: {err}"
        ) from err


def _read_adapter_weights(path: Path) -> dict[str, torch.Tensor]:
    if (path / _ADAPTER_WEIGHTS[0]).is_file():
        from safetensors.torch import load_file

        return load_file(str(path / _ADAPTER_WEIGHTS[0]))
    if (path / _ADAPTER_WEIGHTS[1]).is_file():
        return torch.load(path / _ADAPTER_WEIGHTS[1], map_location="cpu", weights_only=True)
    raise ValueError(f"no adapter weights ({' or '.join(_ADAPTER_WEIGHTS)}) in {path}")


def load_reward_adapter(
    model: nn.Module, reward_adapter: str | os.PathLike, adapter_name: str = "reward_adapter"
) -> nn.Linear:
    """Load a LoRA reward adapter (saved by `PeftModel.save_pretrained` from a SEQ_CLS model) into `model`.

    The LoRA weights become a frozen adapter named `adapter_name` on the same base; the score head (saved
    through `modules_to_save`, e.g. `score`) is returned as a frozen `nn.Linear`. The active adapter does
    not change.
    """
    from peft import PeftConfig, set_peft_model_state_dict

    peft_model = peft_model_of(model)
    if peft_model is None:
        raise ValueError("reward_adapter needs a PEFT policy model (pass peft_config=LoraConfig(...))")
    if adapter_name in peft_model.peft_config:
        raise ValueError(f"reward_adapter_name={adapter_name!r} is already an adapter of this model")
    path = _resolve_adapter_dir(reward_adapter)
    config = PeftConfig.from_pretrained(str(path))
    head_names = set(config.modules_to_save or ()) | {"score", "classifier"}
    config.modules_to_save = None  # the head lives outside the causal LM, loaded below
    config.task_type = peft_model.peft_config[peft_model.active_adapter].task_type
    config.inference_mode = True

    prefix = "base_model.model."
    head_state, lora_state = {}, {}
    for key, tensor in _read_adapter_weights(path).items():
        inner = key[len(prefix) :] if key.startswith(prefix) else key
        first, _, rest = inner.partition(".")
        (head_state if first in head_names else lora_state)[rest if first in head_names else key] = tensor
    if "weight" not in head_state:
        raise ValueError(
            f"reward adapter at {path} has no score head; save the reward model's head with the adapter "
            f"(peft task_type='SEQ_CLS' or modules_to_save=['score'])"
        )

    with _keep_trainable_flags(peft_model):
        peft_model.add_adapter(adapter_name, config)
        result = set_peft_model_state_dict(peft_model, lora_state, adapter_name=adapter_name)
    unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    missing = [k for k in getattr(result, "missing_keys", []) if f".{adapter_name}." in k]
    if unexpected or missing:
        peft_model.delete_adapter(adapter_name)
        raise ValueError(
            f"reward adapter at {path} does not fit this base model (unexpected: {unexpected[:3]}, "
            f"missing: {missing[:3]}); it must be trained on the same base architecture"
        )
    _freeze_adapter(peft_model, adapter_name)

    weight = head_state["weight"]
    hidden = _backbone(peft_model).config.get_text_config().hidden_size
    if weight.shape[1] != hidden:
        raise ValueError(
            f"reward score head expects hidden size {weight.shape[1]}, the base model has {hidden}"
        )
    device = next(peft_model.parameters()).device
    head = nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in head_state, dtype=weight.dtype)
    head.load_state_dict(head_state)
    head.requires_grad_(False)
    return head.to(device)


def _backbone(peft_model: Any) -> nn.Module:
    # transformers' `base_model` property: the decoder stack without the LM head (LlamaModel, GPT2Model, ...)
    return peft_model.get_base_model().base_model


def score_with_adapter(
    model: nn.Module,
    score_head: nn.Linear,
    reward_adapter_name: str,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    ppo_adapter_name: str | None = None,
) -> torch.Tensor:
    """Per-token reward scores (B, T, num_labels), float32: the score head on every final hidden state.

    A sequence classifier's score is the row at the last real token. Runs without gradient and in eval
    mode, with the reward adapter active, then activates `ppo_adapter_name` (default: the adapter active
    before the call).
    """
    peft_model = peft_model_of(model)
    if peft_model is None:
        raise ValueError("scoring with a reward adapter needs a PEFT model")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape (batch, seq_len), got {tuple(input_ids.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} "
            f"differs from input_ids {tuple(input_ids.shape)}"
        )
    if not bool(attention_mask.bool().any(dim=1).all()):
        raise ValueError("every row of attention_mask needs at least one real token (1)")
    _require_adapter(peft_model, reward_adapter_name, "reward_adapter_name")
    if ppo_adapter_name is not None:
        _require_adapter(peft_model, ppo_adapter_name, "ppo_adapter_name")
    with (
        torch.no_grad(),
        eval_mode(peft_model),
        use_adapter(peft_model, reward_adapter_name, ppo_adapter_name),
    ):
        # positions follow the mask, so a left-padded row scores as it would unpadded
        hidden = _backbone(peft_model)(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        ).last_hidden_state
        return score_head(hidden.to(score_head.weight.dtype)).float()


def read_adapter_layout(save_directory: str | os.PathLike) -> dict[str, Any] | None:
    """The adapter layout written by the value-head wrapper's `save_pretrained`, if any."""
    path = Path(save_directory) / "rlhfkit_adapters.json"
    return json.loads(path.read_text()) if path.is_file() else None
