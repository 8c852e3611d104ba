"""`rlhfkit grpo` takes TRL's `--vllm_importance_sampling_*` flags, and they act: a cap that masks every
token leaves the saved model as it started."""

from __future__ import annotations

import json

import torch
from datasets import Dataset
from safetensors.torch import load_file

from rlhfkit.commands._args import parse_args
from rlhfkit.commands.grpo import GRPOScriptArguments, main
from rlhfkit.testing import tiny_model_path
from rlhfkit.trainers.grpo.config import GRPOConfig

TINY_RUN = ["--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "4",
            "--max_steps", "1", "--report_to", "none", "--use_cpu", "--logging_steps", "1", "--save_strategy",
            "no", "--disable_tqdm", "true", "--learning_rate", "1e-2"]  # fmt: skip
MASK_ALL = ["--vllm_importance_sampling_correction", "true", "--vllm_importance_sampling_mode", "token_mask",
            "--vllm_importance_sampling_clip_max", "0.5"]  # fmt: skip


def _config(tmp_path, *flags):
    return parse_args((GRPOScriptArguments, GRPOConfig), [*flags, "--output_dir", str(tmp_path)], "test", "")[
        1
    ]


def test_flags_parse_with_trl_spellings(tmp_path):
    config = _config(tmp_path, *MASK_ALL, "--vllm_importance_sampling_clip_min", "0.1")
    assert config.sampler_correction_active()
    assert config.vllm_importance_sampling_mode == "token_mask"
    assert config.vllm_importance_sampling_clip_max == 0.5
    assert config.vllm_importance_sampling_clip_min == 0.1
    on = _config(tmp_path, "--vllm_importance_sampling_correction", "True")
    assert on.vllm_importance_sampling_correction is True
    off = _config(tmp_path, "--vllm_importance_sampling_correction", "false")
    assert off.vllm_importance_sampling_correction is False and not off.sampler_correction_active()
    assert _config(tmp_path).vllm_importance_sampling_correction is None


def _run(tmp_path, name, *flags) -> dict[str, torch.Tensor]:
    out = tmp_path / name
    code = main([
        "--model_name_or_path", str(tiny_model_path("llama")), "--dataset_name", str(tmp_path / "data.jsonl"),
        "--output_dir", str(out), "--reward_funcs", "cli_rewards.has_e", *flags, *TINY_RUN,
    ])  # fmt: skip
    assert code == 0
    return load_file(str(out / "model.safetensors"))


def test_the_command_applies_the_correction(tmp_path, monkeypatch, capsys):
    (tmp_path / "cli_rewards.py").write_text(
        "def has_e(prompts, completions, **columns):\n    return [float('e' in c) for c in completions]\n"
    )
    Dataset.from_dict({"prompt": ["the film was", "a story about"] * 4}).to_json(str(tmp_path / "data.jsonl"))
    monkeypatch.chdir(tmp_path)
    start = load_file(str(tiny_model_path("llama") / "model.safetensors"))
    masked = _run(tmp_path, "masked", *MASK_ALL)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["updates"] == 1
    # every token's weight is 0 (the decode loop's ratios are ~1 > 0.5): nothing moved
    assert all(torch.equal(start[k], masked[k]) for k in start)
    plain = _run(tmp_path, "plain")  # the same run without the flags learns
    assert any(not torch.equal(start[k], plain[k]) for k in start)
