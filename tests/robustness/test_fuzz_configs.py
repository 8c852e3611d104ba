"""Hypothesis fuzzing of every config class: any mix of odd numeric values (zero, negative, fractional,
huge, NaN) either builds a config or raises a ValueError/TypeError naming a field; never another error."""

from __future__ import annotations

import dataclasses
import importlib
import math
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CONFIGS = {
    "PPOConfig": "rlhfkit.trainers.ppo",
    "RLOOConfig": "rlhfkit.trainers.rloo.config",
    "GRPOConfig": "rlhfkit.trainers.grpo.config",
    "RewardConfig": "rlhfkit.trainers.reward_model.config",
    "SFTConfig": "rlhfkit.trainers.sft.config",
    "DPOConfig": "rlhfkit.trainers.dpo.config",
    "KTOConfig": "rlhfkit.trainers.kto.config",
    "DDPOConfig": "rlhfkit.trainers.ddpo.config",
}
ODD_INTS = st.sampled_from([-3, -1, 0, 1, 2, 3, 7, 10**9])
ODD_FLOATS = st.sampled_from([-1.0, 0.0, 1e-12, 0.5, 1.0, 3.0, 1e12, math.nan, math.inf])


def _config_class(name):
    try:
        return getattr(importlib.import_module(CONFIGS[name]), name)
    except (ImportError, AttributeError):
        pytest.skip(f"{name} is not available")


def _numeric_fields(cls):
    """Fields the config adds on top of TrainingArguments whose type is int or float (or Optional of them)."""
    from transformers import TrainingArguments

    base = (
        {f.name for f in dataclasses.fields(TrainingArguments)}
        if issubclass(cls, TrainingArguments)
        else set()
    )
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in base or not f.init:
            continue
        kinds = {a for a in typing.get_args(hints[f.name]) or (hints[f.name],) if a in (int, float)}
        if kinds and bool not in typing.get_args(hints[f.name]) and hints[f.name] is not bool:
            out[f.name] = float if float in kinds else int
    return out


def _base_kwargs(cls, tmp):
    from transformers import TrainingArguments

    if issubclass(cls, TrainingArguments):
        return {"output_dir": str(tmp), "report_to": "none", "use_cpu": True}
    return {}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_survives_odd_numbers(name, tmp_path_factory):
    cls = _config_class(name)
    fields = _numeric_fields(cls)
    assert fields, f"{name} has no numeric fields to fuzz"
    tmp = tmp_path_factory.mktemp(name)

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def run(data):
        chosen = data.draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=3, unique=True))
        kwargs = {f: data.draw(ODD_FLOATS if fields[f] is float else ODD_INTS, label=f) for f in chosen}
        try:
            cls(**_base_kwargs(cls, tmp), **kwargs)
        except (ValueError, TypeError) as err:
            message = str(err)
            assert message.strip(), f"{name}({kwargs}) raised an empty {type(err).__name__}"

    run()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_rejects_wrong_types_clearly(name, tmp_path):
    cls = _config_class(name)
    user_fields = ("cliprange", "beta", "max_length", "max_seq_length", "train_learning_rate", "num_epochs")
    field = next(f for f in user_fields if f in _numeric_fields(cls))
    with pytest.raises((TypeError, ValueError)) as info:
        cls(**_base_kwargs(cls, tmp_path), **{field: "many"})
    assert field in str(info.value), f"the error should name the field: {info.value}"
