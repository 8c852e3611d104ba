"""`rlhfkit grpo`: group relative policy optimisation from the command line, with TRL's flag names.

    rlhfkit grpo --model_name_or_path ./tiny-llama --dataset_name keyword --output_dir runs/grpo \
        --per_device_train_batch_size 8 --num_generations 4 --max_completion_length 16 --max_steps 50

Rewards: `--reward_funcs` takes dotted import paths of reward functions (e.g. `my_rewards.correct`, or
`rlhfkit.rewards.accuracy_reward`), `--reward_model_name_or_path` a local sequence-classification folder;
with neither, a built-in task (`--dataset_name keyword`, or `addition`, scored against its answer column)
brings its own reward. Every GRPOConfig /
TrainingArguments field is a flag; `--config file.yaml` supplies defaults.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any

from rlhfkit.commands._args import ScriptArguments, TrainerCommand, load_prompts, local_folder
from rlhfkit.trainers.common.config import option


@dataclass
class GRPOScriptArguments(ScriptArguments):
    reward_model_name_or_path: str | None = option(
        None, "Local folder of a sequence-classification reward model (one output)."
    )
    reward_funcs: list[str] | None = option(
        None, "Reward functions as dotted import paths, e.g. 'my_rewards.correct'."
    )
    num_eval_prompts: int = option(16, "Built-in tasks only: test prompts kept aside.")


def import_reward(path: str) -> Any:
    """The function named by a dotted path ('package.module.function'); the working folder is importable."""
    module_name, _, name = path.rpartition(".")
    if not module_name:
        raise ValueError(f"--reward_funcs {path!r} must be a dotted import path such as 'my_rewards.correct'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"--reward_funcs: cannot import {path!r} ({err})") from err


def task_reward(task: Any) -> Any:
    """A built-in task's reward for GRPO: as it is when it reads the dataset's columns (it carries its own
    name), else named after the task, which names its `rewards/<name>` metric."""
    if task.reward_columns:
        return task.reward

    def reward(completions: list, **columns: Any) -> list[float | None]:
        return task.reward(completions, **columns)

    reward.__name__ = task.name.replace("-", "_")
    return reward


def inputs(script_args: GRPOScriptArguments) -> tuple[Any, Any, dict[str, Any]]:
    """Prompts (a built-in task or a local dataset) and the reward functions the flags name."""
    train, evaluation, task = load_prompts(
        script_args.dataset_name,
        script_args.dataset_train_split,
        script_args.dataset_test_split,
        script_args.num_eval_prompts,
    )
    funcs = [import_reward(path) for path in script_args.reward_funcs or []]
    if script_args.reward_model_name_or_path:
        funcs.insert(0, local_folder(script_args.reward_model_name_or_path, "--reward_model_name_or_path"))
    if not funcs and task is not None:
        funcs.append(task_reward(task))
    if not funcs:
        raise ValueError(
            "give --reward_funcs or --reward_model_name_or_path (or a built-in task as --dataset_name)"
        )
    return train, evaluation, {"reward_funcs": funcs}


def _summary(trainer: Any) -> dict[str, Any]:
    """The JSON summary's own fields (a NaN last reward, no reward applied, is written as null)."""
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"updates": trainer.state.global_step, "last_reward": rewards[-1] if rewards else None}


COMMAND = TrainerCommand(
    "rlhfkit grpo",
    "Group relative policy optimisation (GRPO).",
    trainer="rlhfkit.trainers.grpo.trainer:GRPOTrainer",
    config="rlhfkit.trainers.grpo.config:GRPOConfig",
    auto_model="AutoModelForCausalLM",
    peft_task_type="CAUSAL_LM",
    summary=_summary,
    script_arguments=GRPOScriptArguments,
    inputs=inputs,
    evaluate=False,
)


main = COMMAND.main
