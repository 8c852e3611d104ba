"""Checks every trainer config runs in `__post_init__`: exact batch-size division, field types, positive sizes.

Dataclasses and TrainingArguments accept any value; these turn a bad one into an error naming the field
before a model is loaded.
"""

from __future__ import annotations

import types
from typing import Any


def exact_div(a: int, b: int, what: str = "") -> int:
    """`a // b`, raising a clear error when `b` does not divide `a` (e.g. batch sizes)."""
    if b <= 0:
        raise ValueError(f"{what or 'divisor'} must be a positive integer, got {b}")
    if a % b != 0:
        detail = f" ({what})" if what else ""
        raise ValueError(f"{a} is not divisible by {b}{detail}; choose sizes where it divides exactly")
    return a // b


def check_positive_integers(config: Any, names: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    """ValueError naming the first field of `names` (or of `optional`, unless None) that is not an integer >= 1."""
    for name in (*names, *(n for n in optional if getattr(config, n) is not None)):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


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
