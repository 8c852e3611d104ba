"""Training state other than weights, stored as JSON plus safetensors: nothing is ever unpickled.

`save_state(folder, name, state)` writes nested dicts, lists and tuples of tensors, numpy arrays, numbers
and strings as `<name>.json` (the structure, each tensor replaced by a key) and `<name>.safetensors` (the
tensors); `load_state` reads them back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file


def _encode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = value.detach().cpu().contiguous()
        return {"__tensor__": key}
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {"__dict__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, tensors) for v in value]}
    if isinstance(value, list):
        return [_encode(v, tensors) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(
        f"cannot store a {type(value).__name__} in a checkpoint (tensors, numbers, str, containers only)"
    )


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        return tensors[value["__tensor__"]]
    if "__ndarray__" in value:
        return np.asarray(value["__ndarray__"], dtype=value["dtype"])
    if "__tuple__" in value:
        return tuple(_decode(v, tensors) for v in value["__tuple__"])
    return {_decode(k, tensors): _decode(v, tensors) for k, v in value["__dict__"]}


def save_state(folder: str | os.PathLike, name: str, state: Any) -> None:
    """Write nested dicts/lists of tensors and numbers as `<name>.json` + `<name>.safetensors` (no pickle)."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _encode(state, tensors)
    save_file(tensors, str(Path(folder) / f"{name}.safetensors"))
    (Path(folder) / f"{name}.json").write_text(json.dumps(skeleton), encoding="utf-8")


def load_state(folder: str | os.PathLike, name: str) -> Any:
    """Inverse of `save_state`."""
    tensors = load_file(str(Path(folder) / f"{name}.safetensors"))
    return _decode(json.loads((Path(folder) / f"{name}.json").read_text(encoding="utf-8")), tensors)
