"""Shared command-line parsing: YAML values become defaults, flags override them, mistakes are named."""

from __future__ import annotations

import pytest

from rlhfkit.commands._args import ModelArguments, ScriptArguments, parse_args, peft_config_from
from rlhfkit.trainers.dpo.config import DPOConfig


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


def test_load_prompts_takes_a_task_or_a_local_dataset(tmp_path):
    from rlhfkit.commands._args import load_prompts
    from rlhfkit.tasks import task_names

    train, evaluation, task = load_prompts(task_names()[0], num_eval_prompts=3)
    assert task is not None and len(train) > 0 and len(evaluation) == 3
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    train, evaluation, task = load_prompts(str(data), "train", "test")
    assert task is None and evaluation is None and train["prompt"] == ["a", "b"]
    with pytest.raises(ValueError, match="runs offline.*or use a built-in task"):
        load_prompts("org/hub-dataset")
    with pytest.raises(ValueError, match="--dataset_name is required"):
        load_prompts(None)


def test_every_command_names_the_flag_of_a_missing_local_folder(tmp_path):
    from rlhfkit.commands._args import local_folder

    assert local_folder(str(tmp_path), "--model_name_or_path") == str(tmp_path)
    with pytest.raises(
        ValueError, match=r"--sft_model_path 'org/model' is not a local folder; rlhfkit runs offline"
    ):
        local_folder("org/model", "--sft_model_path")
    with pytest.raises(ValueError, match="--model_name_or_path is required"):
        local_folder(None, "--model_name_or_path")


def test_ppo_shares_the_model_and_lora_flags(tmp_path):
    from rlhfkit.commands.ppo import PPOCommandConfig, PPOScriptArguments

    _, _, model = parse_args(
        (PPOScriptArguments, PPOCommandConfig, ModelArguments), ["--use_peft", "--lora_r", "4"], "test", ""
    )
    lora = peft_config_from(model, "CAUSAL_LM")
    assert (lora.r, lora.lora_alpha) == (
        4,
        ModelArguments().lora_alpha,
    )  # one default alpha for every command


def test_a_field_of_the_config_and_the_model_arguments_is_one_flag(tmp_path):
    # DPOConfig and ModelArguments both declare trust_remote_code: one flag, both get its value
    types = (ScriptArguments, DPOConfig, ModelArguments)
    base = ["--output_dir", str(tmp_path), "--report_to", "none"]
    _, config, model_args = parse_args(types, [*base, "--trust_remote_code", "true"], "rlhfkit dpo", "")
    assert config.trust_remote_code is True and model_args.trust_remote_code is True
    _, config, model_args = parse_args(types, base, "rlhfkit dpo", "")
    assert config.trust_remote_code is False and model_args.trust_remote_code is False
