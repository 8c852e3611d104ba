"""`rlhfkit grpo`: group relative policy optimisation from the command line, with TRL's flag names.

    rlhfkit grpo --model_name_or_path ./tiny-llama --dataset_name keyword --output_dir runs/grpo \
        --per_device_train_batch_size 8 --num_generations 4 --max_completion_length 16 --max_steps 50

Rewards: `--reward_funcs` takes import paths of reward functions (`my_rewards:correct`, or dotted as
`rlhfkit.rewards.accuracy_reward`), `--reward_model_name_or_path` a local sequence-classification folder;
with neither, a built-in task (`--dataset_name keyword`, or `addition`, scored against its answer column)
brings its own reward. Agents (docs/agents.md): `--tools my_tools:add,my_tools:multiply`,
`--environment_factory my_env:Game` (its `get_reward` may be the only reward) or `--rollout_func my_mod:fn`.
A built-in task with tools (`--dataset_name calculator`) brings them too, with the chat template that
renders them; any agent flag replaces its tools (as `--reward_funcs` replaces its reward: name the task's
own, `rlhfkit.tasks.calculator:multiply`, to keep them beside yours) and `--chat_template_path` its template.
Every GRPOConfig / TrainingArguments field is a flag; `--config file.yaml` supplies defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlhfkit.commands._args import ScriptArguments, TrainerCommand, load_prompts, local_folder
from rlhfkit.commands._imports import import_callable, import_callables, import_environment_factory
from rlhfkit.trainers.common.config import option


@dataclass
class AgentArguments:
    """Multi-turn training: tools the model may call, environments it acts in, or a whole custom rollout."""

    tools: list[str] | None = option(
        None,
        "Tool functions the model may call, as import paths 'my_tools:add' (several: comma- or "
        "space-separated; a name may hold a list of functions). Each needs type hints and a docstring. "
        "Replaces the tools of a built-in task (calculator's multiply), as any agent flag does.",
    )
    environment_factory: str | None = option(
        None,
        "Import path of an environment class or factory ('my_env:GuessingGame'), one instance per rollout: "
        "its public methods are the tools, reset(**row) starts an episode, get_reward() may score it. A dict "
        "of them picks one per row by the dataset's 'environment' column.",
    )
    rollout_func: str | None = option(
        None,
        "Import path of a function (prompts, trainer) -> dict with prompt_ids, completion_ids, logprobs "
        "(and optionally env_mask and columns for the reward functions) that replaces generation.",
    )

    def agent_keywords(self) -> dict[str, Any]:
        """The trainer keywords the flags name (only those given, so a trainer without them is unaffected)."""
        found: dict[str, Any] = {}
        if self.tools:
            found["tools"] = import_callables(self.tools, "--tools")
        if self.environment_factory:
            found["environment_factory"] = import_environment_factory(
                self.environment_factory, "--environment_factory"
            )
        if self.rollout_func:
            found["rollout_func"] = import_callable(self.rollout_func, "--rollout_func")
        return found


@dataclass
class GRPOScriptArguments(ScriptArguments, AgentArguments):
    reward_model_name_or_path: str | None = option(
        None, "Local folder of a sequence-classification reward model (one output)."
    )
    reward_funcs: list[str] | None = option(
        None, "Reward functions as import paths, e.g. 'my_rewards:correct' or 'my_rewards.correct'."
    )
    num_eval_prompts: int = option(16, "Built-in tasks only: test prompts kept aside.")


def task_reward(task: Any) -> Any:
    """A built-in task's reward for GRPO: as it is when it reads the dataset's columns (it carries its own
    name), else named after the task, which names its `rewards/<name>` metric."""
    if task.reward_columns:
        return task.reward

    def reward(completions: list, **columns: Any) -> list[float | None]:
        return task.reward(completions, **columns)

    reward.__name__ = task.name.replace("-", "_")
    return reward


def task_agents(task: Any, agents: dict[str, Any]) -> dict[str, Any]:
    """What a built-in task brings for agents: its tools, unless an agent flag (`agents`) says what the model
    acts on, and its chat template (the `chat_template` entry `run_trainer_command` sets on the tokenizer,
    which `--chat_template_path` replaces)."""
    found: dict[str, Any] = {}
    if task.tools and not agents:
        found["tools"] = list(task.tools)
    if task.chat_template:
        found["chat_template"] = task.chat_template
    return found


def inputs(script_args: GRPOScriptArguments) -> tuple[Any, Any, dict[str, Any]]:
    """Prompts (a built-in task or a local dataset), the reward functions and the agent objects (tools,
    environments, rollout function) the flags name or the task brings; names are imported first, so a bad
    one fails fast."""
    funcs = import_callables(script_args.reward_funcs, "--reward_funcs")
    agents = script_args.agent_keywords()
    train, evaluation, task = load_prompts(
        script_args.dataset_name,
        script_args.dataset_train_split,
        script_args.dataset_test_split,
        script_args.num_eval_prompts,
    )
    if script_args.reward_model_name_or_path:
        funcs.insert(0, local_folder(script_args.reward_model_name_or_path, "--reward_model_name_or_path"))
    if task is not None:
        agents = {**task_agents(task, agents), **agents}
    if not funcs and task is not None:
        funcs.append(task_reward(task))
    if not funcs and "environment_factory" not in agents:  # an environment may score with get_reward
        raise ValueError(
            "give --reward_funcs or --reward_model_name_or_path (or a built-in task as --dataset_name, or an "
            "--environment_factory whose environment has get_reward)"
        )
    return train, evaluation, {"reward_funcs": funcs, **agents}


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
