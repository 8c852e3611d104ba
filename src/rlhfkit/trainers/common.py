"""Plumbing shared by the trainers: batch-size arithmetic, atomic checkpoint folders, RNG state.

Used by composition: a trainer calls these functions, it does not inherit from a base class.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import tempfile
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


@contextlib.contextmanager
def atomic_directory(final_dir: str | os.PathLike) -> Iterator[Path]:
    """Write a checkpoint folder atomically: files go to a temp folder that is renamed into place.

    A crash mid-write leaves any previous `final_dir` untouched; a reader never sees half a checkpoint.
    """
    final = Path(final_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        for f in tmp.rglob("*"):  # flush file contents before the rename makes them visible
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        old = None
        if final.exists():
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, old)
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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
