"""Seed 000 (TRL's RLOO trainer doc) transcribed: its code example, its trainer and config signatures and its
command lines run with only `trl` -> `rlhfkit`, tiny local models and datasets in place of hub names and
sizes shrunk. Checked against what the seed documents: every listed metric logged at every update, the
sample table (query / model response / score), the files written.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset, DatasetDict

from rlhfkit import RLOOConfig, RLOOTrainer
from rlhfkit.core import rloo_advantages
from rlhfkit.testing import tiny_model, tiny_model_path, tiny_tokenizer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RLOO_SCRIPT = EXAMPLES / "scripts" / "rloo" / "rloo.py"

# "记录指标的解释": the metrics seed 000 lists, logged at every update
SEED_METRICS = (
    "eps objective/kl objective/entropy objective/non_score_reward objective/rlhf_reward objective/scores "
    "policy/approxkl_avg policy/clipfrac_avg loss/policy_avg val/clipfrac_avg policy/entropy_avg val/ratio "
    "val/ratio_var val/num_eos_tokens lr episode"
).split()

# TRL 0.x's RLOOConfig signature, every argument at the seed's default (lr_scheduler_kwargs and
# include_for_metrics default to a factory and are left out); ~30 of these left TrainingArguments in
# transformers 5 and are accepted by rlhfkit.trainers.common.legacy_training_args
SEED_RLOO_CONFIG = {
    "output_dir": None,
    "overwrite_output_dir": False,
    "do_train": False,
    "do_eval": False,
    "do_predict": False,
    "eval_strategy": "no",
    "prediction_loss_only": False,
    "per_device_train_batch_size": 8,
    "per_device_eval_batch_size": 8,
    "per_gpu_train_batch_size": None,
    "per_gpu_eval_batch_size": None,
    "gradient_accumulation_steps": 1,
    "eval_accumulation_steps": None,
    "eval_delay": 0,
    "torch_empty_cache_steps": None,
    "learning_rate": 5e-05,
    "weight_decay": 0.0,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "adam_epsilon": 1e-08,
    "max_grad_norm": 1.0,
    "num_train_epochs": 3.0,
    "max_steps": -1,
    "lr_scheduler_type": "linear",
    "warmup_ratio": 0.0,
    "warmup_steps": 0,
    "log_level": "passive",
    "log_level_replica": "warning",
    "log_on_each_node": True,
    "logging_dir": None,
    "logging_strategy": "steps",
    "logging_first_step": False,
    "logging_steps": 500,
    "logging_nan_inf_filter": True,
    "save_strategy": "steps",
    "save_steps": 500,
    "save_total_limit": None,
    "save_safetensors": True,
    "save_on_each_node": False,
    "save_only_model": False,
    "restore_callback_states_from_checkpoint": False,
    "no_cuda": False,
    "use_cpu": False,
    "use_mps_device": False,
    "seed": 42,
    "data_seed": None,
    "jit_mode_eval": False,
    "use_ipex": False,
    "bf16": False,
    "fp16": False,
    "fp16_opt_level": "O1",
    "half_precision_backend": "auto",
    "bf16_full_eval": False,
    "fp16_full_eval": False,
    "tf32": None,
    "local_rank": -1,
    "ddp_backend": None,
    "tpu_num_cores": None,
    "tpu_metrics_debug": False,
    "debug": "",
    "dataloader_drop_last": False,
    "eval_steps": None,
    "dataloader_num_workers": 0,
    "dataloader_prefetch_factor": None,
    "past_index": -1,
    "run_name": None,
    "disable_tqdm": None,
    "remove_unused_columns": True,
    "label_names": None,
    "load_best_model_at_end": False,
    "metric_for_best_model": None,
    "greater_is_better": None,
    "ignore_data_skip": False,
    "fsdp": "",
    "fsdp_min_num_params": 0,
    "fsdp_config": None,
    "tp_size": 0,
    "fsdp_transformer_layer_cls_to_wrap": None,
    "accelerator_config": None,
    "deepspeed": None,
    "label_smoothing_factor": 0.0,
    "optim": "adamw_torch",
    "optim_args": None,
    "adafactor": False,
    "group_by_length": False,
    "length_column_name": "length",
    "report_to": None,
    "ddp_find_unused_parameters": None,
    "ddp_bucket_cap_mb": None,
    "ddp_broadcast_buffers": None,
    "dataloader_pin_memory": True,
    "dataloader_persistent_workers": False,
    "skip_memory_metrics": True,
    "use_legacy_prediction_loop": False,
    "push_to_hub": False,
    "resume_from_checkpoint": None,
    "hub_model_id": None,
    "hub_strategy": "every_save",
    "hub_token": None,
    "hub_private_repo": None,
    "hub_always_push": False,
    "gradient_checkpointing": False,
    "gradient_checkpointing_kwargs": None,
    "include_inputs_for_metrics": False,
    "eval_do_concat_batches": True,
    "fp16_backend": "auto",
    "push_to_hub_model_id": None,
    "push_to_hub_organization": None,
    "push_to_hub_token": None,
    "mp_parameters": "",
    "auto_find_batch_size": False,
    "full_determinism": False,
    "torchdynamo": None,
    "ray_scope": "last",
    "ddp_timeout": 1800,
    "torch_compile": False,
    "torch_compile_backend": None,
    "torch_compile_mode": None,
    "include_tokens_per_second": False,
    "include_num_input_tokens_seen": False,
    "neftune_noise_alpha": None,
    "optim_target_modules": None,
    "batch_eval_metrics": False,
    "eval_on_start": False,
    "use_liger_kernel": False,
    "eval_use_gather_object": False,
    "average_tokens_across_devices": False,
    "dataset_num_proc": None,
    "num_mini_batches": 1,
    "total_episodes": None,
    "local_rollout_forward_batch_size": 64,
    "num_sample_generations": 10,
    "response_length": 53,
    "stop_token": None,
    "stop_token_id": None,
    "temperature": 0.7,
    "missing_eos_penalty": None,
    "sft_model_path": "EleutherAI/pythia-160m",
    "world_size": None,
    "num_total_batches": None,
    "micro_batch_size": None,
    "local_batch_size": None,
    "batch_size": None,
    "local_mini_batch_size": None,
    "mini_batch_size": None,
    "exp_name": "rloo_config",
    "reward_model_path": "EleutherAI/pythia-160m",
    "num_ppo_epochs": 4,
    "whiten_rewards": False,
    "kl_coef": 0.05,
    "cliprange": 0.2,
    "rloo_k": 2,
    "normalize_reward": False,
    "reward_clip_range": 10.0,
    "normalize_advantage": False,
    "token_level_kl": False,
    "ds3_gather_for_generation": True,
}

PROMPTS = ["the cat sat on", "a dog ran to", "once upon a time", "he said that", "we went to", "she saw a"]


def test_seed_vectorized_rloo_advantage_example():
    # seed 000 "实现细节", verbatim but for the function name
    local_batch_size = 3
    rloo_k = 4
    rlhf_reward = torch.tensor(
        [
            1,
            2,
            3,  # first rlhf reward for three prompts
            2,
            3,
            4,  # second rlhf reward for three prompts
            5,
            6,
            7,  # third rlhf reward for three prompts
            8,
            9,
            10,  # fourth rlhf reward for three prompts
        ]
    ).float()  # here we have 3 prompts which have 4 completions each

    baseline = (rlhf_reward.sum(0) - rlhf_reward) / (rloo_k - 1)
    advantages = torch.zeros_like(rlhf_reward)
    for i in range(0, len(advantages), local_batch_size):
        other_response_rlhf_rewards = []
        for j in range(0, len(advantages), local_batch_size):
            if i != j:
                other_response_rlhf_rewards.append(rlhf_reward[j : j + local_batch_size])
        advantages[i : i + local_batch_size] = rlhf_reward[i : i + local_batch_size] - torch.stack(
            other_response_rlhf_rewards
        ).mean(0)
    assert (1 - (2 + 5 + 8) / 3 - advantages[0].item()) < 1e-6  # First rlhf reward for the first prompt
    assert (6 - (3 + 2 + 9) / 3 - advantages[7].item()) < 1e-6  # Third rlhf reward for the second prompt

    # Vectorized implementation
    rlhf_reward = rlhf_reward.reshape(rloo_k, local_batch_size)
    baseline = (rlhf_reward.sum(0) - rlhf_reward) / (rloo_k - 1)
    vec_advantages = rlhf_reward - baseline
    torch.testing.assert_close(vec_advantages.flatten(), advantages)

    # rlhfkit's shipped function takes each prompt's k completions on consecutive rows (row i * k + j):
    # the seed's (k, B) grid, transposed
    ours = rloo_advantages(rlhf_reward.T.flatten(), rloo_k).reshape(local_batch_size, rloo_k).T
    torch.testing.assert_close(ours.flatten(), advantages)


def test_seed_rloo_config_signature_is_accepted_at_its_defaults(tmp_path):
    config = RLOOConfig(**{**SEED_RLOO_CONFIG, "output_dir": str(tmp_path), "report_to": "none"})
    assert config.rloo_k == 2 and config.kl_coef == 0.05 and config.sft_model_path == "EleutherAI/pythia-160m"
    assert config.use_cpu is False and config.eval_strategy == "no"


def test_seed_trainer_signature_logs_every_update_and_prints_the_sample_table(tmp_path, capsys):
    tokenizer = tiny_tokenizer(padding_side="left")
    config = RLOOConfig(
        output_dir=str(tmp_path / "rloo"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        total_episodes=12,
        missing_eos_penalty=1.0,
        response_length=4,
        num_sample_generations=1,
        no_cuda=True,  # a transformers 4 name from the seed's signature: mapped to use_cpu
        report_to="none",
    )
    trainer = RLOOTrainer(
        config=config,
        processing_class=tokenizer,
        policy=tiny_model("llama"),
        ref_policy=tiny_model("llama"),
        reward_model=tiny_model("llama-reward"),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        data_collator=None,
        eval_dataset={"validation": Dataset.from_dict({"prompt": PROMPTS[:2]})},
        optimizers=(None, None),
        callbacks=None,
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "objective/scores" in h]
    assert [h["episode"] for h in logs] == [4, 8, 12]  # one log per update, logging_steps untouched
    for entry in logs:
        assert set(SEED_METRICS) <= set(entry)
        assert all(torch.isfinite(torch.tensor(float(entry[m]))) for m in SEED_METRICS)
    table = capsys.readouterr().out
    assert "query" in table and "model response" in table and "score" in table
    rows = [json.loads(r) for r in (tmp_path / "rloo" / "samples-validation" / "samples.jsonl").open()]
    assert [r["query"] for r in rows] == PROMPTS[:2]

    trainer.create_model_card(model_name="rloo-tiny", dataset_name="local-prompts", tags=["seed-000"])
    card = (tmp_path / "rloo" / "README.md").read_text()
    assert "rloo-tiny" in card and "local-prompts" in card and "- seed-000" in card


@pytest.fixture(scope="module")
def descriptiveness(tmp_path_factory) -> Path:
    """A local stand-in for trl-internal-testing/descriptiveness-sentiment-trl-style
    (split 'descriptiveness')."""
    path = tmp_path_factory.mktemp("data") / "descriptiveness-sentiment-trl-style"
    prompts = Dataset.from_dict({"prompt": PROMPTS + PROMPTS[:2]})
    DatasetDict({"descriptiveness": prompts, "validation": prompts.select(range(2))}).save_to_disk(str(path))
    return path


@pytest.mark.slow
def test_seed_command_line_runs_through_the_script_and_logs_every_update(tmp_path, descriptiveness):
    model = str(tiny_model_path("llama"))
    output_dir = tmp_path / "models" / "minimal" / "rloo"
    # seed 000 "开始使用", hub names -> local paths, 64 per device -> 4, 10000 episodes -> 8
    cmd = [
        sys.executable, str(RLOO_SCRIPT),
        "--dataset_name", str(descriptiveness),
        "--dataset_train_split", "descriptiveness",
        "--learning_rate", "3e-6",
        "--output_dir", str(output_dir),
        "--per_device_train_batch_size", "4",
        "--gradient_accumulation_steps", "1",
        "--total_episodes", "8",
        "--model_name_or_path", model,
        "--reward_model_path", model,
        "--missing_eos_penalty", "1.0",
        "--response_length", "4",  # shrunk from the default 53
        "--report_to", "none",
    ]  # fmt: skip
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 updates, 8 episodes" in result.stdout and "objective/scores=nan" not in result.stdout
    for name in ("model.safetensors", "config.json", "README.md", "samples.jsonl", "samples.csv"):
        assert (output_dir / name).exists(), name
    (state,) = output_dir.glob("checkpoint-*/trainer_state.json")
    logs = [h for h in json.loads(state.read_text())["log_history"] if "objective/scores" in h]
    assert [h["episode"] for h in logs] == [4, 8]
    assert all(set(SEED_METRICS) <= set(h) for h in logs)


def test_seed_benchmark_command_line_without_the_deepspeed_launcher(tmp_path, descriptiveness, monkeypatch):
    # seed 000 "基准实验" minus `accelerate launch --config_file .../deepspeed_zero2.yaml`
    # (DeepSpeed needs GPUs); hub names -> local paths, sizes shrunk
    model = str(tiny_model_path("llama"))
    output_dir = tmp_path / "models" / "minimal" / "rloo_tldr"
    argv = [
        "--output_dir", str(output_dir),
        "--dataset_name", str(descriptiveness),
        "--dataset_train_split", "descriptiveness",
        "--dataset_test_split", "validation",
        "--num_ppo_epochs", "2",
        "--num_mini_batches", "2",
        "--learning_rate", "3e-6",
        "--per_device_train_batch_size", "2",
        "--gradient_accumulation_steps", "2",
        "--total_episodes", "8",
        "--model_name_or_path", model,
        "--sft_model_path", model,
        "--reward_model_path", model,
        "--local_rollout_forward_batch_size", "4",
        "--missing_eos_penalty", "1.0",
        "--stop_token", "eos",
        "--kl_coef", "0.03",
        "--response_length", "4",
        "--report_to", "none",
        "--use_cpu",
    ]  # fmt: skip
    monkeypatch.setattr(sys, "argv", [str(RLOO_SCRIPT), *argv])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(RLOO_SCRIPT), run_name="__main__")
    assert exit_info.value.code == 0
    assert (output_dir / "model.safetensors").exists()
    rows = [json.loads(r) for r in (output_dir / "samples.jsonl").open()]
    assert {r["query"] for r in rows} == set(PROMPTS[:2])  # the sample table draws on the validation split


@pytest.mark.parametrize(
    "script",
    [
        "scripts/rloo/rloo.py",
        "scripts/ppo.py",
        "scripts/reward_modeling.py",
        "scripts/sft.py",
        "scripts/dpo.py",
        "scripts/ddpo.py",
    ],
)
def test_seed_script_paths_parse_help(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [script, "--help"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    assert exit_info.value.code == 0
    assert "--output_dir" in capsys.readouterr().out
