"""TrainingArguments names that transformers 5 removed, still accepted by every rlhfkit Trainer config.

TRL 0.x's `RLOOConfig` signature (and TRL code written against transformers 4) passes about thirty
fields that transformers 5 dropped (`no_cuda`, `warmup_ratio`, `evaluation_strategy`, ...). Each is
declared here once, as a field with its transformers 4 default, so it works both as a constructor
keyword and as an `HfArgumentParser` flag. Before `TrainingArguments.__post_init__` runs, a value other
than that default is moved to its successor (or dropped where transformers 5 has none) and the field is
reset, so a saved config reloads without re-applying it. Each old name warns once per process, naming the
replacement.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments


class RemovedTrainingArgumentWarning(FutureWarning):
    """A TrainingArguments name removed in transformers 5 was given; its successor was used instead."""


def _set(name: str) -> Callable[[Any, Any], None]:
    def move(args: Any, value: Any) -> None:
        setattr(args, name, value)

    return move


def _warmup_ratio(args: Any, value: float) -> None:
    # transformers 5 reads a warmup_steps in [0, 1) as a fraction of the total steps
    if not 0 <= value < 1:
        raise ValueError(f"warmup_ratio must be in [0, 1), got {value}; give warmup_steps as a step count")
    if not args.warmup_steps:  # as before: an explicit warmup_steps wins over warmup_ratio
        args.warmup_steps = value


def _logging_dir(args: Any, value: str) -> None:
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", value)


def _fsdp_key(key: str) -> Callable[[Any, Any], None]:
    def move(args: Any, value: Any) -> None:
        if isinstance(args.fsdp_config, str):
            raise ValueError(f"give {key} inside the fsdp_config file {args.fsdp_config!r}, not as a flag")
        args.fsdp_config = {**(args.fsdp_config or {}), key: value}

    return move


def _organization(args: Any, value: str) -> None:
    name = args.hub_model_id or os.path.basename(os.path.normpath(args.output_dir or "model"))
    args.hub_model_id = name if "/" in name else f"{value}/{name}"


def _flag(name: str, value: Any) -> Callable[[Any, bool], None]:
    def move(args: Any, on: bool) -> None:
        if on:
            setattr(args, name, value)

    return move


def _include_inputs(args: Any, on: bool) -> None:
    if on and "inputs" not in (args.include_for_metrics or []):
        args.include_for_metrics = [*(args.include_for_metrics or []), "inputs"]


# old name -> (its transformers 4 default, what replaces it, how to move a value there or None to drop it,
# its transformers 4 annotation, which is also its HfArgumentParser type)
REMOVED_TRAINING_ARGS: dict[str, tuple[Any, str, Callable[[Any, Any], None] | None, str]] = {
    "evaluation_strategy": ("no", "eval_strategy", _set("eval_strategy"), "str"),
    "no_cuda": (False, "use_cpu", _set("use_cpu"), "bool"),
    "per_gpu_train_batch_size": (
        None,
        "per_device_train_batch_size",
        _set("per_device_train_batch_size"),
        "int | None",
    ),
    "per_gpu_eval_batch_size": (
        None,
        "per_device_eval_batch_size",
        _set("per_device_eval_batch_size"),
        "int | None",
    ),
    "warmup_ratio": (
        0.0,
        "warmup_steps (a float in [0, 1) is a fraction of the steps)",
        _warmup_ratio,
        "float",
    ),
    "logging_dir": (None, "the TENSORBOARD_LOGGING_DIR environment variable", _logging_dir, "str | None"),
    "push_to_hub_model_id": (None, "hub_model_id", _set("hub_model_id"), "str | None"),
    "push_to_hub_organization": (None, "hub_model_id='organization/name'", _organization, "str | None"),
    "push_to_hub_token": (None, "hub_token", _set("hub_token"), "str | None"),
    "torchdynamo": (None, "torch_compile_backend", _set("torch_compile_backend"), "str | None"),
    "adafactor": (False, "optim='adafactor'", _flag("optim", "adafactor"), "bool"),
    "group_by_length": (
        False,
        "train_sampling_strategy='group_by_length'",
        _flag("train_sampling_strategy", "group_by_length"),
        "bool",
    ),
    "include_inputs_for_metrics": (False, "include_for_metrics=['inputs']", _include_inputs, "bool"),
    "fsdp_min_num_params": (0, "fsdp_config={'min_num_params': ...}", _fsdp_key("min_num_params"), "int"),
    "fsdp_transformer_layer_cls_to_wrap": (
        None,
        "fsdp_config={'transformer_layer_cls_to_wrap': ...}",
        _fsdp_key("transformer_layer_cls_to_wrap"),
        "str | None",
    ),
    # no successor: the value is dropped
    "overwrite_output_dir": (
        False,
        "output_dir is never refused; resume with resume_from_checkpoint",
        None,
        "bool",
    ),
    "save_safetensors": (True, "weights are always saved as safetensors", None, "bool | None"),
    "use_mps_device": (False, "an MPS device is used automatically (use_cpu=True opts out)", None, "bool"),
    "jit_mode_eval": (False, "no transformers 5 equivalent", None, "bool"),
    "use_ipex": (False, "no transformers 5 equivalent", None, "bool"),
    "fp16_opt_level": ("O1", "no transformers 5 equivalent; fp16/bf16 use torch.amp", None, "str"),
    "half_precision_backend": ("auto", "no transformers 5 equivalent; fp16/bf16 use torch.amp", None, "str"),
    "fp16_backend": ("auto", "no transformers 5 equivalent; fp16/bf16 use torch.amp", None, "str"),
    "tpu_num_cores": (None, "no transformers 5 equivalent", None, "int | None"),
    "tpu_metrics_debug": (False, "debug='tpu_metrics_debug'", _flag("debug", "tpu_metrics_debug"), "bool"),
    "past_index": (-1, "no transformers 5 equivalent", None, "int"),
    "tp_size": (0, "use parallelism_config (accelerate ParallelismConfig)", None, "int | None"),
    "use_legacy_prediction_loop": (False, "no transformers 5 equivalent", None, "bool"),
    "mp_parameters": ("", "no transformers 5 equivalent", None, "str"),
    "ray_scope": ("last", "no transformers 5 equivalent", None, "str | None"),
    "include_tokens_per_second": (False, "use include_num_input_tokens_seen", None, "bool | None"),
}

_warned: set[str] = set()


def _help(name: str) -> str:
    _, replacement, move, _ = REMOVED_TRAINING_ARGS[name]
    action = "mapped to" if move is not None else "ignored:"
    return f"Removed in transformers 5, accepted for TRL compatibility and {action} {replacement}."


def _with_removed_fields(cls: type) -> type:
    """Give `cls` one field per REMOVED_TRAINING_ARGS entry, as if declared in its body (for @dataclass)."""
    cls.__annotations__ = {name: entry[3] for name, entry in REMOVED_TRAINING_ARGS.items()}
    for name, entry in REMOVED_TRAINING_ARGS.items():
        setattr(cls, name, field(default=entry[0], metadata={"help": _help(name)}))
    return cls


@dataclass
@_with_removed_fields
class LegacyTrainingArguments(TrainingArguments):
    """`TrainingArguments` that also takes the names transformers 5 removed (see REMOVED_TRAINING_ARGS)."""

    def __post_init__(self):
        apply_removed_training_args(self)
        super().__post_init__()


def apply_removed_training_args(args: Any) -> None:
    """Move each removed name set away from its old default to its successor, warn once per name, reset it."""
    for name, (old_default, replacement, move, _) in REMOVED_TRAINING_ARGS.items():
        value = getattr(args, name, old_default)
        if value == old_default:
            continue
        setattr(args, name, old_default)
        if name not in _warned:
            _warned.add(name)
            action = "mapped to" if move is not None else "ignored:"
            warnings.warn(
                f"{type(args).__name__}: `{name}` was removed in transformers 5; {action} {replacement}",
                RemovedTrainingArgumentWarning,
                stacklevel=_constructor_caller_level(),
            )
        if move is not None:
            move(args, value)


def _constructor_caller_level() -> int:
    """Stack level, seen from `apply_removed_training_args`, of the code that built the config.

    The `__post_init__` chain is as deep as the config's inheritance, so the warning walks up to the
    dataclass `__init__` and points one frame above it, at the user's line.
    """
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_name != "__init__":
        frame, level = frame.f_back, level + 1
    return level + 1 if frame is not None else 2
