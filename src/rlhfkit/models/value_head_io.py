"""The disk side of the value-head wrappers: loading the base model, reading and writing the value head.

A folder written by `PreTrainedModelWrapper.save_pretrained` holds what transformers/peft save for the
base (full weights, or only the adapters of a PEFT model), `value_head.safetensors`, and for a PEFT
model `rlhfkit_adapters.json`: which adapters there are, which one was active, which is the reference.
A plain adapter folder (only `adapter_config.json` and its weights, e.g. an SFT LoRA) also loads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhfkit.models import adapters
from rlhfkit.models.quantization import bnb_quantization_config, is_quantized

VALUE_HEAD_FILE = "value_head.safetensors"
ADAPTER_LAYOUT_FILE = "rlhfkit_adapters.json"


# ----------------------------------------------------------------- the base model
def base_model(
    parent_class: Any,
    pretrained: str | os.PathLike | nn.Module,
    model_args: tuple,
    *,
    peft_config: Any,
    is_trainable: bool,
    load_in_8bit: bool,
    load_in_4bit: bool,
    model_kwargs: dict[str, Any],
) -> tuple[nn.Module, str | None]:
    """(the model to put a value head on, the folder or Hub id it was loaded from; None if built).

    `pretrained` is an already built transformers model or PeftModel, or a folder or Hub id loaded with
    `parent_class` (see `load_base_model`); `peft_config` adds a fresh adapter to either.
    """
    if isinstance(pretrained, nn.Module):
        return _built_model(pretrained, peft_config, quantize=load_in_8bit or load_in_4bit), None
    if isinstance(pretrained, str | os.PathLike):
        source = str(pretrained)
        quantization = bnb_quantization_config(load_in_8bit, load_in_4bit)
        model = load_base_model(
            parent_class, source, model_args, peft_config, is_trainable, quantization, model_kwargs
        )
        return model, source
    raise TypeError(
        "pretrained_model_name_or_path must be a folder, a Hub id or a transformers/peft model, "
        f"got {type(pretrained).__name__}"
    )


def _built_model(model: nn.Module, peft_config: Any, quantize: bool) -> nn.Module:
    """An already built model, with a fresh adapter when `peft_config` is given."""
    from peft import PeftModel, get_peft_model

    if quantize:
        raise ValueError("load_in_8bit/load_in_4bit apply when loading by name; this model is already built")
    if peft_config is not None:
        if isinstance(model, PeftModel):
            raise ValueError("peft_config was given but the model is already a PeftModel")
        model = get_peft_model(model, peft_config)
    return model


def load_base_model(
    parent_class: Any,
    source: str,
    model_args: tuple,
    peft_config: Any,
    is_trainable: bool,
    quantization: Any,
    model_kwargs: dict[str, Any],
) -> nn.Module:
    """The model a folder or Hub id holds.

    An adapter folder gives its PeftModel (`load_adapter_folder`); anything else is a full model loaded
    with `parent_class`, quantised with `quantization` (a bitsandbytes config, or None) and given a fresh
    adapter when `peft_config` is set.
    """
    from peft import get_peft_model

    if quantization is not None:
        if "quantization_config" in model_kwargs:
            raise ValueError("pass either load_in_8bit/load_in_4bit or quantization_config, not both")
        model_kwargs["quantization_config"] = quantization
    model = load_adapter_folder(parent_class, source, model_args, peft_config, is_trainable, model_kwargs)
    if model is not None:
        return model
    model = parent_class.from_pretrained(source, *model_args, **model_kwargs)
    if peft_config is not None:
        if is_quantized(model):
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        model = get_peft_model(model, peft_config)
    return model


def _adapter_layout(folder: Path) -> dict[str, Any] | None:
    """The saved adapter layout of `folder`, or None for a folder without adapters.

    A plain adapter folder reads as one `default` adapter whose frozen copy, the reference, is still to
    be made (`reference_adapter: "new"`).
    """
    layout = adapters.read_adapter_layout(folder) if folder.is_dir() else None
    if layout is None and (folder / "adapter_config.json").is_file():
        layout = {"adapters": {"default": "."}, "active_adapter": "default", "reference_adapter": "new"}
    return layout


def load_adapter_folder(
    parent_class: Any,
    source: str,
    model_args: tuple,
    peft_config: Any,
    is_trainable: bool,
    model_kwargs: dict[str, Any],
) -> Any | None:
    """A PeftModel if `source` is an adapter folder, else None (then `source` is a full model)."""
    from peft import PeftConfig, PeftModel

    folder = Path(source)
    layout = _adapter_layout(folder)
    if layout is None:
        return None
    if peft_config is not None:
        raise ValueError(
            f"peft_config cannot be combined with the adapter folder {source}: that adapter is loaded as "
            "the policy. To add a fresh adapter on top of it, merge it into the base first "
            "(PeftModel.merge_and_unload(), save_pretrained) and load the merged folder."
        )
    names = layout["adapters"]
    reference = layout["reference_adapter"]
    first = "default" if "default" in names else next(iter(names))
    base_name = PeftConfig.from_pretrained(str(folder / names[first])).base_model_name_or_path
    if not base_name:
        raise ValueError(f"adapter_config.json in {folder / names[first]} does not name its base model")
    base = parent_class.from_pretrained(base_name, *model_args, **model_kwargs)
    model = PeftModel.from_pretrained(
        base,
        str(folder / names[first]),
        adapter_name=first,
        is_trainable=is_trainable and first != reference,
    )
    for name, sub in names.items():
        if name != first:
            model.load_adapter(
                str(folder / sub), adapter_name=name, is_trainable=is_trainable and name != reference
            )
    with adapters._keep_trainable_flags(model):
        model.set_adapter(layout["active_adapter"])
    if reference == "new":  # a plain (SFT) adapter folder: its frozen copy is the KL reference
        adapters.add_reference_adapter(model, source_adapter="default")
    return model


# ----------------------------------------------------------------- the value head and the adapter layout
def _value_head_shards(folder: Path) -> set[str]:
    """The safetensors files of the model weights that hold `v_head.*` keys (TRL's layout)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {f for k, f in weight_map.items() if k.startswith("v_head.")}
    return {"model.safetensors"} if (folder / "model.safetensors").is_file() else set()


def read_value_head(pretrained: str | os.PathLike) -> dict[str, torch.Tensor] | None:
    """`summary.*` tensors (v_head keys without the prefix), or None when there is no saved value head.

    Read from `value_head.safetensors`, else from `v_head.*` keys in the model weights.
    """
    from safetensors import safe_open
    from safetensors.torch import load_file

    folder = Path(pretrained)
    if not folder.is_dir():
        try:  # a Hub id: the value head, if any, sits next to the base weights
            from huggingface_hub import hf_hub_download

            folder = Path(hf_hub_download(str(pretrained), VALUE_HEAD_FILE)).parent
        except Exception:
            return None
    if (folder / VALUE_HEAD_FILE).is_file():
        state = load_file(str(folder / VALUE_HEAD_FILE))
    else:
        state = {}
        for shard in _value_head_shards(folder):
            with safe_open(str(folder / shard), framework="pt") as f:
                state.update({k: f.get_tensor(k) for k in f.keys() if k.startswith("v_head.")})
    state = {k.removeprefix("v_head."): v for k, v in state.items()}
    return state or None


def save_adapters(peft_model: Any, folder: Path, reward_adapter_name: str | None, **kwargs: Any) -> None:
    """Every adapter but the reward adapter (an input, reloaded from its own folder), and their layout."""
    kwargs.pop("max_shard_size", None)  # adapters are small: one file each
    names = [n for n in peft_model.peft_config if n != reward_adapter_name]
    peft_model.save_pretrained(folder, selected_adapters=names, **kwargs)
    reference = adapters.REFERENCE_ADAPTER_NAME
    layout = {
        "adapters": {n: "." if n == "default" else n for n in names},
        "active_adapter": peft_model.active_adapter,
        "reference_adapter": reference if reference in names else None,
    }
    (folder / ADAPTER_LAYOUT_FILE).write_text(json.dumps(layout, indent=2))


def write_value_head(folder: Path, state_dict: dict[str, torch.Tensor]) -> None:
    """The `v_head.*` tensors of `state_dict`, as float32 on the CPU, into `value_head.safetensors`."""
    from safetensors.torch import save_file

    head = {
        k: v.detach().to("cpu", torch.float32).contiguous()
        for k, v in state_dict.items()
        if k.startswith("v_head.")
    }
    save_file(head, str(folder / VALUE_HEAD_FILE))


def upload_value_head(v_head: nn.Module, repo_id: str, token: str | None) -> None:
    """Upload `value_head.safetensors` to the Hub repo `repo_id`, next to the base model's files."""
    import tempfile

    from huggingface_hub import HfApi
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        head = {f"v_head.{k}": v.detach().to("cpu").contiguous() for k, v in v_head.state_dict().items()}
        save_file(head, os.path.join(tmp, VALUE_HEAD_FILE))
        HfApi(token=token).upload_file(
            path_or_fileobj=os.path.join(tmp, VALUE_HEAD_FILE),
            path_in_repo=VALUE_HEAD_FILE,
            repo_id=repo_id,
        )
