"""TrainingArguments names removed in transformers 5: accepted by every Trainer config, as a keyword and
as a flag, moved to their successor (or dropped), one warning per name; unknown names still fail."""

from __future__ import annotations

import os
import warnings

import pytest
from transformers import HfArgumentParser

from rlhfkit.trainers.common import legacy_training_args
from rlhfkit.trainers.common.legacy_training_args import (
    REMOVED_TRAINING_ARGS,
    LegacyTrainingArguments,
    RemovedTrainingArgumentWarning,
)
from rlhfkit.trainers.dpo.config import DPOConfig
from rlhfkit.trainers.reward_model.config import RewardConfig
from rlhfkit.trainers.rloo.config import RLOOConfig
from rlhfkit.trainers.sft.config import SFTConfig

# the fields of TRL 0.x's RLOOConfig signature that transformers 5's TrainingArguments no longer has
SEED_000_REMOVED = (
    "overwrite_output_dir per_gpu_train_batch_size per_gpu_eval_batch_size warmup_ratio logging_dir "
    "save_safetensors no_cuda use_mps_device jit_mode_eval use_ipex fp16_opt_level half_precision_backend "
    "tpu_num_cores tpu_metrics_debug past_index fsdp_min_num_params tp_size "
    "fsdp_transformer_layer_cls_to_wrap adafactor group_by_length use_legacy_prediction_loop "
    "include_inputs_for_metrics fp16_backend push_to_hub_model_id push_to_hub_organization "
    "push_to_hub_token mp_parameters torchdynamo ray_scope include_tokens_per_second"
).split()

# old name -> (value given, {successor field: expected value}); an empty dict: dropped, nothing else changes
MAPPED = {
    "evaluation_strategy": ("steps", {"eval_strategy": "steps", "do_eval": True, "eval_steps": 500}),
    "no_cuda": (True, {"use_cpu": True, "dataloader_pin_memory": False}),
    "per_gpu_train_batch_size": (4, {"per_device_train_batch_size": 4}),
    "per_gpu_eval_batch_size": (5, {"per_device_eval_batch_size": 5}),
    "warmup_ratio": (0.25, {"warmup_steps": 0.25}),
    "push_to_hub_model_id": ("me/model", {"hub_model_id": "me/model"}),
    "push_to_hub_organization": ("org", {"hub_model_id": "org/out"}),
    "push_to_hub_token": ("secret", {"hub_token": "secret"}),
    "torchdynamo": ("eager", {"torch_compile_backend": "eager", "torch_compile": True}),
    "adafactor": (True, {"optim": "adafactor"}),
    "group_by_length": (True, {"train_sampling_strategy": "group_by_length"}),
    "include_inputs_for_metrics": (True, {"include_for_metrics": ["inputs"]}),
    "fsdp_min_num_params": (1000, {"fsdp_config": {"min_num_params": 1000}}),
    "fsdp_transformer_layer_cls_to_wrap": ("LlamaDecoderLayer", {}),
    "tpu_metrics_debug": (True, {"debug": ["tpu_metrics_debug"]}),
    "overwrite_output_dir": (True, {}),
    "save_safetensors": (False, {}),
    "use_mps_device": (True, {}),
    "jit_mode_eval": (True, {}),
    "use_ipex": (True, {}),
    "fp16_opt_level": ("O2", {}),
    "half_precision_backend": ("apex", {}),
    "fp16_backend": ("apex", {}),
    "tpu_num_cores": (8, {}),
    "past_index": (2, {}),
    "tp_size": (2, {}),
    "use_legacy_prediction_loop": (True, {}),
    "mp_parameters": ("x", {}),
    "ray_scope": ("all", {}),
    "include_tokens_per_second": (True, {}),
}


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(legacy_training_args, "_warned", set())
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)


def _config(cls=RLOOConfig, **kwargs):
    return cls(output_dir="out", report_to="none", **kwargs)


def _normalised(config) -> dict:
    return {k: str(v) for k, v in config.to_dict().items()}


def test_every_removed_name_of_seed_000_is_handled_and_tested():
    assert set(SEED_000_REMOVED) <= set(REMOVED_TRAINING_ARGS)
    assert set(MAPPED) == set(REMOVED_TRAINING_ARGS) - {"logging_dir"}  # logging_dir: its own test


@pytest.mark.parametrize("name", sorted(MAPPED))
def test_old_name_maps_to_its_successor_and_warns_naming_it(name):
    value, expected = MAPPED[name]
    baseline = _normalised(_config(LegacyTrainingArguments))
    with pytest.warns(RemovedTrainingArgumentWarning) as caught:
        config = _config(LegacyTrainingArguments, **{name: value})
    (warning,) = [w for w in caught if issubclass(w.category, RemovedTrainingArgumentWarning)]
    assert name in str(warning.message)
    assert REMOVED_TRAINING_ARGS[name][1] in str(warning.message)
    assert getattr(config, name) == REMOVED_TRAINING_ARGS[name][0]  # reset: a saved config reloads cleanly
    for field, want in expected.items():
        got = getattr(config, field)
        got = [getattr(x, "value", x) for x in got] if isinstance(got, list) else got
        assert got == want or str(got) == str(want), (field, got)
    if name == "fsdp_transformer_layer_cls_to_wrap":
        assert config.fsdp_config["transformer_layer_cls_to_wrap"] in (
            "LlamaDecoderLayer",
            ["LlamaDecoderLayer"],
        )
    changed = {k for k, v in _normalised(config).items() if baseline.get(k) != v}
    assert changed <= set(expected) | {"fsdp_config"}


def test_logging_dir_becomes_the_tensorboard_directory(tmp_path):
    with pytest.warns(RemovedTrainingArgumentWarning, match="TENSORBOARD_LOGGING_DIR"):
        _config(logging_dir=str(tmp_path / "tb"))
    assert os.environ["TENSORBOARD_LOGGING_DIR"] == str(tmp_path / "tb")


def test_old_defaults_are_silent_and_an_explicit_warmup_steps_wins():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RemovedTrainingArgumentWarning)
        _config(no_cuda=False, warmup_ratio=0.0, ray_scope="last", save_safetensors=True)
    with pytest.warns(RemovedTrainingArgumentWarning):
        assert _config(warmup_ratio=0.5, warmup_steps=7).warmup_steps == 7
    with pytest.raises(ValueError, match="warmup_ratio"):
        _config(warmup_ratio=1.5)


def test_each_name_warns_once_per_process():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert _config(no_cuda=True, evaluation_strategy="epoch").use_cpu
    removed = [w for w in caught if issubclass(w.category, RemovedTrainingArgumentWarning)]
    assert len(removed) == 2
    assert sum("no_cuda" in str(w.message) for w in removed) == 1
    assert all(w.filename == __file__ for w in removed)  # points at the line that built the config


@pytest.mark.parametrize("cls", [RLOOConfig, RewardConfig, SFTConfig, DPOConfig])
def test_every_trainer_config_accepts_old_names_as_keywords_and_flags(cls):
    with pytest.warns(RemovedTrainingArgumentWarning):
        config = _config(cls, no_cuda=True, per_gpu_train_batch_size=2)
    assert config.use_cpu and config.per_device_train_batch_size == 2
    flags = ["--output_dir", "out", "--report_to", "none", "--no_cuda", "--warmup_ratio", "0.1"]
    flags += ["--evaluation_strategy", "steps", "--eval_steps", "3", "--overwrite_output_dir"]
    (parsed,) = HfArgumentParser(cls).parse_args_into_dataclasses(args=flags)
    assert parsed.use_cpu and parsed.warmup_steps == 0.1 and parsed.eval_strategy == "steps"


def test_unknown_names_still_fail():
    with pytest.raises(TypeError, match="not_a_field"):
        _config(not_a_field=1)
    parser = HfArgumentParser(RLOOConfig)
    with pytest.raises(ValueError, match="not_a_field"):
        parser.parse_args_into_dataclasses(args=["--output_dir", "out", "--not_a_field", "1"])
