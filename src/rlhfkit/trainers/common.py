"""Plumbing shared by the trainers: batch-size arithmetic, atomic checkpoint folders, RNG state.

Also the checks every trainer shares: config field types, positive batch sizes, readable
checkpoints (before anything is loaded), and the ZeRO-3 / FSDP2 gather around generation.
Used by composition: a trainer calls these functions, it does not inherit from a base class.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch


def exact_div(a: int, b: int, what: str = "") -> int:
    """`a // b`, raising a clear error when `b` does not divide `a` (e.g. batch sizes)."""
    if b <= 0:
        raise ValueError(f"{what or 'divisor'} must be a positive integer, got {b}")
    if a % b != 0:
        detail = f" ({what})" if what else ""
        raise ValueError(f"{a} is not divisible by {b}{detail}; choose sizes where it divides exactly")
    return a // b


CHECKPOINT_PREFIX = "checkpoint-"
_CHECKPOINT_RE = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")


def _fsync_tree(folder: Path) -> None:
    for f in folder.rglob("*"):  # flush file contents before a rename makes them visible
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


def _recover_interrupted_replace(final: Path) -> None:
    """Undo a crash between the two renames of `publish_directory`: the old copy goes back into place."""
    if final.exists():
        return
    leftovers = sorted(final.parent.glob(f".{final.name}.old-*"), key=lambda p: p.stat().st_mtime)
    if leftovers:
        os.replace(leftovers[-1], final)


def publish_directory(staged: str | os.PathLike, final_dir: str | os.PathLike) -> Path:
    """Move a fully written folder to `final_dir`, replacing any previous one, by renames only.

    A crash at any point leaves either the old or the new folder readable under `final_dir`
    (a crash between the two renames is undone by the next save or `latest_checkpoint`).
    """
    staged, final = Path(staged), Path(final_dir)
    _fsync_tree(staged)
    _recover_interrupted_replace(final)
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(staged, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


@contextlib.contextmanager
def atomic_directory(final_dir: str | os.PathLike) -> Iterator[Path]:
    """Write a checkpoint folder atomically: files go to a temp folder that is renamed into place.

    A crash mid-write leaves any previous `final_dir` untouched; a reader never sees half a checkpoint.
    """
    final = Path(final_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    _recover_interrupted_replace(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        publish_directory(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The `checkpoint-<step>` folder with the highest step in `output_dir`, or None.

    Half-written saves live in dot-named temp folders, so every `checkpoint-<step>` found is complete.
    """
    root = Path(output_dir)
    if not root.is_dir():
        return None
    for leftover in root.glob(f".{CHECKPOINT_PREFIX}*.old-*"):
        _recover_interrupted_replace(root / leftover.name[1:].split(".old-")[0])
    steps = [
        (int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _CHECKPOINT_RE.match(p.name))
    ]
    return max(steps)[1] if steps else None


def rng_state() -> dict[str, Any]:
    """Every RNG a training step draws from, so a resumed run continues with the same numbers."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def check_field_types(config: Any, skip_fields_of: type | None = None) -> None:
    """Raise a TypeError naming the field when a config value does not match its int/float/str/bool annotation.

    Dataclasses do not check types, so `cliprange="0.2"` would otherwise fail later with an unrelated
    comparison error. Fields declared by `skip_fields_of` (e.g. TrainingArguments, which converts its own
    values) and fields with other annotations are left alone. An int is accepted where a float is expected.
    """
    import dataclasses
    import typing

    skip = {f.name for f in dataclasses.fields(skip_fields_of)} if skip_fields_of is not None else set()
    hints = typing.get_type_hints(type(config))
    simple = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}
    for f in dataclasses.fields(config):
        if f.name in skip or f.name not in hints:
            continue
        hint = hints[f.name]
        options = (
            typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        )
        if not all(o in simple or o is type(None) for o in options):
            continue  # lists, Literals, dicts...: the config's own checks handle them
        value = getattr(config, f.name)
        allowed = tuple(t for o in options for t in (simple.get(o) or (type(None),)))
        ok = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in options)
        if not ok:
            names = " or ".join("None" if o is type(None) else o.__name__ for o in options)
            raise TypeError(
                f"{type(config).__name__}.{f.name} must be {names}, got {type(value).__name__} {value!r}"
            )


def check_training_sizes(args: Any) -> None:
    """ValueError naming the flag when a TrainingArguments batch size or step count is zero or negative."""
    names = ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps")
    for name in (*names, "max_consecutive_nonfinite_steps"):
        value = getattr(args, name, None)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def validate_checkpoint(path: str | os.PathLike) -> Path:
    """Check that a checkpoint folder exists and that its files are readable, before anything is loaded.

    A truncated or corrupt file raises a ValueError naming it (instead of a parser error deep inside
    safetensors or torch). Cheap: JSON files are parsed, safetensors headers and zip directories read.
    """
    import json
    import zipfile

    from safetensors import safe_open

    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"checkpoint {str(folder)!r} does not exist or is not a folder")
    if not any(folder.iterdir()):
        raise ValueError(f"checkpoint {str(folder)!r} is empty")
    for f in sorted(folder.rglob("*")):
        if not f.is_file():
            continue
        try:
            if f.suffix == ".json":
                json.loads(f.read_text(encoding="utf-8"))
            elif f.suffix == ".safetensors":
                with safe_open(str(f), framework="pt") as fh:
                    fh.keys()
            elif f.suffix in (".pt", ".pth", ".bin"):  # torch.save writes zip archives
                with zipfile.ZipFile(f) as zf:
                    zf.namelist()
        except Exception as err:  # noqa: BLE001 - any parse failure means the same thing here
            raise ValueError(
                f"checkpoint file {str(f)!r} is corrupt or truncated ({type(err).__name__}: {err}); "
                "resume from an earlier checkpoint-* folder"
            ) from err
    return folder


def zero3_generation_context(accelerator: Any, model: torch.nn.Module, gather: bool = True):
    """Under DeepSpeed ZeRO-3 with `gather`, a context that gathers `model`'s sharded weights once for a
    whole generation (fast; needs room for one full copy). Otherwise, and when `gather` is False (each
    layer is then gathered on use: slow, but any size fits), a no-op context. Under FSDP, see
    `fsdp_generation_context`.
    """
    if getattr(getattr(accelerator, "state", None), "fsdp_plugin", None) is not None:
        return fsdp_generation_context(accelerator, model, gather)  # FSDP's counterpart
    plugin = getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None)
    if plugin is None or getattr(plugin, "zero_stage", None) != 3 or not gather:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(model.parameters()))


@contextlib.contextmanager
def fsdp_generation_context(accelerator: Any, model: torch.nn.Module, gather: bool = True) -> Iterator[None]:
    """Under FSDP2, the weights of `model` that `generate` needs, all-gathered before it and re-sharded after.

    A value-head model generates through its inner model, past the root's forward hooks that would gather
    the root's own weights (embeddings, head): those are always gathered here. With `gather` every layer is
    gathered once for the whole generation (fast; room for one full copy); without it each layer is
    gathered on use, once per token (slow; any size fits). A no-op unless `model` is an FSDP2 module.
    """
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        yield
        return
    model._get_fsdp_state()._lazy_init()  # as the root's first forward would: the layers must not claim root
    units = [m for m in model.modules() if isinstance(m, FSDPModule)] if gather else [model]
    if gather:
        model.set_reshard_after_forward(False)  # the layers' forward hooks keep what was gathered
    for unit in units:
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
        if gather:
            model.set_reshard_after_forward(bool(accelerator.state.fsdp_plugin.reshard_after_forward))


def fused_optimizer_kwargs(params: list[torch.Tensor]) -> dict[str, Any]:
    """`{"fused": True}` when torch has a fused Adam/AdamW kernel for every parameter, else `{}`.

    The default per-tensor loop launches a dozen small kernels per parameter; the fused kernel does one
    pass. Measured on 2 CPU threads, per optimizer step: 2.5 -> 0.65 ms for the 0.5M-parameter benchmark
    model, 36 -> 7.8 ms for the 10M one. Results agree to float rounding.
    """
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    supported = set(_get_fused_kernels_supported_devices())
    ok = bool(params) and all(p.device.type in supported and torch.is_floating_point(p) for p in params)
    return {"fused": True} if ok else {}
