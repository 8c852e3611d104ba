"""`rlhfkit grpo --use_vllm true --vllm_mode colocate`: the engine in the training process, from the command.

vLLM lives in .venv-vllm (`make vllm-env`; CI builds it), so the command runs there, on this checkout's
sources. With a learning rate large enough to move the policy at every step, each step's sampler logprobs
still equal the trainer's: the trainer synced the engine after every optimizer step (an unsynced engine
drifts by more than 1e-2 here; tests/rollout/colocate_cases.py). The sampler correction is on by default
with vLLM, so its ratio statistics are logged.
"""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest
from datasets import Dataset

from rlhfkit.testing import tiny_model_path

REPO = Path(__file__).resolve().parents[2]
COMMAND = REPO / ".venv-vllm" / "bin" / "rlhfkit"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not COMMAND.exists(), reason="no .venv-vllm: run `make vllm-env`"),
]


def _logged(stdout: str) -> list[dict]:
    """The per-step log entries the command prints (one Python dict per line)."""
    entries = [ast.literal_eval(line) for line in stdout.splitlines() if line.startswith("{'")]
    return [e for e in entries if "loss" in e]


def test_grpo_command_trains_with_a_colocated_engine_synced_every_step(tmp_path):
    (tmp_path / "cli_rewards.py").write_text(
        "def has_e(prompts, completions, **columns):\n    return [float('e' in c) for c in completions]\n"
    )
    Dataset.from_dict({"prompt": ["the film was", "a story about"] * 4}).to_json(str(tmp_path / "data.jsonl"))
    argv = [
        str(COMMAND), "grpo", "--model_name_or_path", str(tiny_model_path("llama")),
        "--dataset_name", "data.jsonl", "--output_dir", "out", "--reward_funcs", "cli_rewards.has_e",
        "--use_vllm", "true", "--vllm_mode", "colocate", "--learning_rate", "1e-2",
        "--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "4",
        "--max_steps", "3", "--report_to", "none", "--use_cpu", "--logging_steps", "1",
        "--save_strategy", "no", "--disable_tqdm", "true",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    steps = _logged(run.stdout)
    assert len(steps) == 3
    gaps = [float(step["sampling/sampling_logp_difference/max"]) for step in steps]
    assert max(gaps) < 1e-3, gaps  # every step sampled from the weights it trained
    assert all("sampling/importance_sampling_ratio/mean" in step for step in steps)
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_grpo_command_constrains_a_colocated_engine_to_the_regex(tmp_path):
    # the colocated engine compiles the regex against the trainer's tokenizer, which the trainer hands it
    (tmp_path / "cli_rewards.py").write_text(  # fails the run unless every completion matched
        "import re\n"
        "def matches(prompts, completions, **columns):\n"
        "    assert all(re.fullmatch('(yes|no)!', c) for c in completions), completions\n"
        "    return [float(c == 'yes!') for c in completions]\n"
    )
    Dataset.from_dict({"prompt": ["the film was", "a story about"] * 4}).to_json(str(tmp_path / "data.jsonl"))
    argv = [
        str(COMMAND), "grpo", "--model_name_or_path", str(tiny_model_path("llama")),
        "--dataset_name", "data.jsonl", "--output_dir", "out", "--reward_funcs", "cli_rewards.matches",
        "--use_vllm", "true", "--vllm_mode", "colocate", "--vllm_structured_outputs_regex", "(yes|no)!",
        "--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "6",
        "--max_steps", "1", "--report_to", "none", "--use_cpu", "--logging_steps", "1",
        "--save_strategy", "no", "--disable_tqdm", "true",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    (step,) = _logged(run.stdout)
    assert float(step["sampling/logprobs_processed"]) == 1.0  # masked by the regex: the old policy is retaken
