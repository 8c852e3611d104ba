"""`rlhfkit rloo`: REINFORCE leave-one-out training from the command line, in either of TRL's forms.

The current form (TRL 1.x, GRPO-shaped), chosen by any of its flags (`--num_generations`, `--beta`,
`--max_completion_length`, `--reward_funcs`, `--reward_model_name_or_path`, ...; the agent flags `--tools`,
`--environment_factory`, `--rollout_func`); rewards and agents as `rlhfkit grpo`:

    rlhfkit rloo --dataset_name keyword --model_name_or_path ./tiny-llama --output_dir runs/rloo \
        --per_device_train_batch_size 8 --num_generations 4 --max_completion_length 16 --max_steps 50

The classic form (TRL 0.x), otherwise:

    rlhfkit rloo --dataset_name keyword --model_name_or_path ./tiny-llama --output_dir runs/rloo \
        --per_device_train_batch_size 8 --total_episodes 256 --missing_eos_penalty 1.0

In the classic form the policy and the reference start from --sft_model_path (default:
--model_name_or_path); the score comes from --reward_model_path (a local sequence-classification
folder) or, when --dataset_name is a built-in task, from that task's reward unless a reward model folder
is given. Every RLOOConfig / TrainingArguments field is a flag; `--config file.yaml` supplies defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from rlhfkit.commands._args import (
    ModelArguments,
    ResumeArguments,
    ScriptArguments,
    TrainerCommand,
    load_prompts,
    load_tokenizer,
    local_folder,
    parse_args,
    run_main,
    start_run,
    stopped_early,
)
from rlhfkit.commands.grpo import AgentArguments
from rlhfkit.data.loading import offline_error
from rlhfkit.trainers.common.config import option

PROG = "rlhfkit rloo"


@dataclass
class RLOOScriptArguments(ScriptArguments, AgentArguments):
    num_eval_prompts: int = option(16, "Built-in tasks only: how many test prompts to use for sample tables.")
    reward_model_name_or_path: str | None = option(
        None, "Current form: local folder of a sequence-classification reward model (one output)."
    )
    reward_funcs: list[str] | None = option(
        None,
        "Current form: reward functions as import paths, e.g. 'my_rewards:correct' or 'my_rewards.correct'.",
    )


def _current_inputs(script_args: RLOOScriptArguments):
    from rlhfkit.commands.grpo import inputs

    return inputs(script_args)


def _current_summary(trainer) -> dict:
    from rlhfkit.commands.grpo import _summary

    return _summary(trainer)


CURRENT_FORM = TrainerCommand(
    PROG,
    "REINFORCE leave-one-out training",
    trainer="rlhfkit.trainers.rloo.current:GroupRLOOTrainer",
    config="rlhfkit.trainers.rloo.config:RLOOConfig",
    auto_model="AutoModelForCausalLM",
    peft_task_type="CAUSAL_LM",
    summary=_current_summary,
    script_arguments=RLOOScriptArguments,
    inputs=_current_inputs,
    evaluate=False,
)


def _default(name: str) -> str:
    from rlhfkit.trainers.rloo.config import RLOOConfig

    return next(f.default for f in fields(RLOOConfig) if f.name == name)


def _body(argv: list[str] | None) -> int:
    import torch  # noqa: F401  (fail early if the environment is broken)
    from transformers import AutoModelForCausalLM

    from rlhfkit.commands._args import model_init_kwargs, peft_config_from
    from rlhfkit.rewards.reward_models import load_reward_model
    from rlhfkit.trainers.rloo.config import RLOOConfig

    script_args, config, model_args, resume = parse_args(
        (RLOOScriptArguments, RLOOConfig, ModelArguments, ResumeArguments),
        argv,
        PROG,
        "REINFORCE leave-one-out training",
    )
    rewards = script_args.reward_funcs or script_args.reward_model_name_or_path
    agents = script_args.tools or script_args.environment_factory or script_args.rollout_func
    if config.form == "current" or rewards or agents:
        from rlhfkit.commands._args import run_trainer_command

        return run_trainer_command(CURRENT_FORM, argv)
    trust = resume.trust_unverified_checkpoint
    checkpoint = start_run(PROG, config.output_dir, config.resume_from_checkpoint, config, trust)  # first
    train_dataset, eval_dataset, task = load_prompts(
        script_args.dataset_name,
        script_args.dataset_train_split,
        script_args.dataset_test_split,
        script_args.num_eval_prompts,
    )
    from rlhfkit.trainers.rloo.trainer import RLOOTrainer

    sft_path = config.sft_model_path
    if sft_path == _default("sft_model_path") and not Path(sft_path).exists():
        sft_path = model_args.model_name_or_path
    if sft_path is None:
        raise ValueError("--model_name_or_path (or --sft_model_path) is required: a local model folder")
    local_folder(sft_path, "--sft_model_path")
    if model_args.model_name_or_path is None:
        model_args.model_name_or_path = sft_path

    reward_path, reward_tokenizer = config.reward_model_path, None
    if Path(reward_path).exists():  # its own tokenizer, when its folder has one, encodes what it reads
        reward, reward_tokenizer = load_reward_model(reward_path, **model_init_kwargs(model_args))
    elif task is not None and reward_path in (_default("reward_model_path"), "task"):
        reward = task.text_reward("--dataset_name", "RLOO's reward")
    else:
        raise offline_error("--reward_model_path", reward_path)

    tokenizer = load_tokenizer(model_args, padding_side="left")
    policy = AutoModelForCausalLM.from_pretrained(sft_path, **model_init_kwargs(model_args))
    ref_policy = AutoModelForCausalLM.from_pretrained(sft_path, **model_init_kwargs(model_args))
    peft_config = peft_config_from(model_args, "CAUSAL_LM")
    if peft_config is not None:
        from peft import get_peft_model

        policy = get_peft_model(policy, peft_config)

    trainer = RLOOTrainer(
        config, tokenizer, policy, ref_policy, reward, train_dataset, eval_dataset=eval_dataset,
        reward_processing_class=reward_tokenizer,
    )  # fmt: skip
    result = trainer.train(
        resume_from_checkpoint=checkpoint and str(checkpoint), trust_unverified_checkpoint=trust
    )
    if trainer.stopped_by_signal:  # no final model for an unfinished run
        return stopped_early(PROG, trainer.graceful_stop, trainer.last_checkpoint, result.global_step)
    trainer.save_model(config.output_dir)
    trainer.create_model_card(dataset_name=script_args.dataset_name)
    last = next((h for h in reversed(trainer.state.log_history) if "objective/scores" in h), {})
    print(
        f"{PROG}: {result.global_step} updates, {result.global_step * config.batch_size} episodes; "
        f"last objective/scores={last.get('objective/scores', float('nan')):.4f}; "
        f"model saved to {config.output_dir}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, _body, argv)
