"""Shared command-line parsing: YAML values become defaults, flags override them, mistakes are named."""

from __future__ import annotations

import pytest

from rlhfkit.commands._args import ModelArguments, ScriptArguments, parse_args, peft_config_from
from rlhfkit.trainers.dpo_config import DPOConfig


def test_yaml_defaults_and_flag_override(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("beta: 0.5\nmax_steps: 7\ndataset_name: data.jsonl\nuse_peft: true\nlora_r: 4\n")
    script, dpo, model = parse_args(
        (ScriptArguments, DPOConfig, ModelArguments),
        ["--config", str(config), "--max_steps", "3", "--output_dir", str(tmp_path / "o"), "--use_cpu"],
        "test",
        "",
    )
    assert script.dataset_name == "data.jsonl" and script.dataset_train_split == "train"
    assert dpo.beta == 0.5 and dpo.max_steps == 3  # the flag beats the file
    lora = peft_config_from(model, "CAUSAL_LM")
    assert lora.r == 4 and lora.task_type == "CAUSAL_LM"
    assert peft_config_from(ModelArguments(), "CAUSAL_LM") is None


def test_yaml_mistakes_are_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("betta: 0.5\n")
    with pytest.raises(SystemExit, match="betta"):
        parse_args((ScriptArguments, DPOConfig), ["--config", str(bad)], "test", "")
    with pytest.raises(SystemExit, match="does not exist"):
        parse_args((ScriptArguments, DPOConfig), ["--config", str(tmp_path / "none.yaml")], "test", "")
    with pytest.raises(ValueError, match="dtype"):
        ModelArguments(dtype="float8")
