"""`rlhfkit ppo`: the classic generate -> score -> step loop of `PPOTrainer` on a built-in task or local data.

    rlhfkit ppo --dataset_name length --steps 25 --batch_size 32 --output_dir runs/ppo
    rlhfkit ppo --model_name_or_path ./my-sft --dataset_name prompts.jsonl --reward ./my-reward-model

--model_name_or_path defaults to the offline tiny llama; --dataset_name is a built-in task
(`rlhfkit.tasks`) or a local dataset with a "query" (or "prompt") column; --reward is "task" (the
task's reward function) or a local sequence-classification reward model folder. Every PPOConfig field
is a flag (defaults here suit the tiny models on a CPU); `--config file.yaml` supplies defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhfkit.commands._args import (
    ModelArguments,
    ResumeArguments,
    load_prompts,
    load_tokenizer,
    local_folder,
    model_init_kwargs,
    parse_args,
    peft_config_from,
    run_main,
    start_run,
    stopped_early,
    summary_json,
)
from rlhfkit.trainers.common.checkpointing import CHECKPOINT_PREFIX, prune_checkpoints
from rlhfkit.trainers.common.config import option
from rlhfkit.trainers.ppo import PPOConfig, PPOTrainer

PROG = "rlhfkit ppo"
# plain sampling from the policy's whole distribution: no top-k/top-p cut, no minimum length
SAMPLING_KWARGS = {"min_length": -1, "top_k": 0, "top_p": 1.0, "do_sample": True}


@dataclass
class PPOScriptArguments:
    """Data, reward and run flags; the model and LoRA flags are the shared `ModelArguments`."""

    dataset_name: str = option(
        "length", "Built-in task name (see rlhfkit.tasks) or a local dataset with a 'query'/'prompt' column."
    )
    dataset_train_split: str = option("train", "Split of a local dataset to use.")
    reward: str = option(
        "task", "'task' (the built-in task's reward function) or a local reward-model folder."
    )
    output_dir: str = option("ppo-output", "Where the trained model is saved.")
    max_new_tokens: int = option(8, "Longest response, in tokens.")
    num_prompts: int | None = option(None, "Use only this many prompts (None: all).")
    save_steps: int = option(0, "Checkpoint every N steps into output_dir/checkpoint-<step> (0: off).")
    save_total_limit: int | None = option(
        None, "Keep at most this many checkpoint-<step> folders (None: all)."
    )
    resume_from_checkpoint: str | None = option(
        None,
        "A checkpoint-<step> folder, or an output folder (its newest intact checkpoint), to continue from.",
    )


@dataclass
class PPOCommandConfig(PPOConfig):
    """PPOConfig with defaults that finish in a minute or two with the tiny models on a CPU."""

    steps: int = option(25, "Number of PPO steps (batches of prompts).")
    batch_size: int = option(32, "Prompts per step.")
    mini_batch_size: int = option(16, "Samples per forward/backward pass.")
    learning_rate: float = option(1e-3, "Adam learning rate (high: tiny random models).")
    init_kl_coef: float = option(0.05, "Initial KL coefficient.")


def prompt_dataset(args: PPOScriptArguments, tokenizer: Any):
    """(dataset with 'query' and 'input_ids', the task's reward function or None)."""
    dataset, _, task = load_prompts(args.dataset_name, args.dataset_train_split)
    if "query" not in dataset.column_names:
        if "prompt" not in dataset.column_names:
            raise ValueError(
                f"--dataset_name: needs a 'query' or 'prompt' column, has {dataset.column_names}"
            )
        dataset = dataset.rename_column("prompt", "query")
    if args.num_prompts is not None:
        dataset = dataset.select(range(min(args.num_prompts, len(dataset))))
    dataset = dataset.map(lambda row: {"input_ids": tokenizer.encode(row["query"])})
    if task is None or args.reward != "task":
        return dataset, None
    return dataset, task.text_reward("--dataset_name", "PPO's reward")


def reward_scorer(args: PPOScriptArguments, task_reward: Any, tokenizer: Any, device: Any):
    """A `RewardScorer`: the task's reward function or a local reward model.

    The task's function scores the completions; a reward model reads the full texts (prompt + completion).
    """
    from rlhfkit.rewards.scoring import RewardScorer

    if args.reward == "task":
        if task_reward is None:
            raise ValueError(
                "--reward task needs a built-in --dataset_name; for local data pass a reward model folder"
            )
        return RewardScorer(task_reward, tokenizer, device=device)
    if not Path(args.reward).is_dir():
        raise ValueError(f"--reward {args.reward!r} is neither 'task' nor a local reward-model folder")
    from rlhfkit.rewards.reward_models import load_reward_model

    # with its own tokenizer the reward model reads prompt + completion as text, encoded as it was in
    # training (special tokens on); without one, the policy's token ids (checked against its vocabulary)
    model, reward_tokenizer = load_reward_model(args.reward)
    return RewardScorer(model, tokenizer, reward_tokenizer, device=device, add_special_tokens=True)


def _check_paths(args: PPOScriptArguments, model_args: ModelArguments) -> None:
    from rlhfkit.tasks import task_names

    if model_args.model_name_or_path is not None:
        local_folder(model_args.model_name_or_path, "--model_name_or_path")
    if args.dataset_name not in task_names() and not Path(args.dataset_name).exists():
        raise ValueError(
            f"--dataset_name {args.dataset_name!r} is neither a built-in task ({', '.join(task_names())}) "
            "nor a local dataset path"
        )
    if args.reward != "task" and not Path(args.reward).is_dir():
        raise ValueError(f"--reward {args.reward!r} is neither 'task' nor a local reward-model folder")


@dataclass
class _Run:
    """How the training loop ended: the first and last mean scores, and where a stop request saved to."""

    first_mean_score: float | None = None
    last_mean_score: float | None = None
    stopped_checkpoint: str | None = None  # set when SIGINT/SIGTERM ended the run early


def _build_trainer(
    args: PPOScriptArguments, config: PPOCommandConfig, model_args: ModelArguments
) -> tuple[PPOTrainer, Any]:
    """(trainer, reward scorer): the tokenizer, prompts, value-head policy and reward, ready to train."""
    from rlhfkit.models.value_head import AutoModelForCausalLMWithValueHead
    from rlhfkit.testing import tiny_model_path

    if model_args.model_name_or_path is None:
        model_args.model_name_or_path = str(tiny_model_path("llama"))
    path = model_args.model_name_or_path
    tokenizer = load_tokenizer(model_args, padding_side="left")
    dataset, task_reward = prompt_dataset(args, tokenizer)
    config.model_name, config.query_dataset = path, args.dataset_name
    model = AutoModelForCausalLMWithValueHead.from_pretrained(
        path, peft_config=peft_config_from(model_args, "CAUSAL_LM"), **model_init_kwargs(model_args)
    )
    trainer = PPOTrainer(config, model, tokenizer=tokenizer, dataset=dataset)
    if len(trainer.dataloader) == 0:
        raise ValueError(
            f"--dataset_name has {len(dataset)} prompts, fewer than --batch_size {config.batch_size}"
        )
    return trainer, reward_scorer(args, task_reward, tokenizer, trainer.current_device)


def _checkpoint_folder(trainer: PPOTrainer, args: PPOScriptArguments) -> str:
    """output_dir/checkpoint-<current step>."""
    return str(Path(args.output_dir) / f"{CHECKPOINT_PREFIX}{trainer.current_step}")


def _save_checkpoint(trainer: PPOTrainer, args: PPOScriptArguments) -> str:
    """Checkpoint into output_dir/checkpoint-<step>, keeping at most --save_total_limit of them."""
    folder = _checkpoint_folder(trainer, args)
    trainer.save_checkpoint(folder)
    prune_checkpoints(args.output_dir, args.save_total_limit, protect=(folder,))
    return folder


def _ppo_step(
    trainer: PPOTrainer, scorer: Any, batch: dict, config: PPOCommandConfig, max_new_tokens: int
) -> dict[str, Any]:
    """Generate responses to a batch of prompts, score them, take one PPO step and log it."""
    queries = batch["input_ids"]
    responses = trainer.generate(
        queries,
        return_prompt=False,
        batch_size=config.batch_size,
        **SAMPLING_KWARGS,
        max_new_tokens=max_new_tokens,
    )
    batch["response"] = trainer.tokenizer.batch_decode(responses, skip_special_tokens=True)
    # a task scores the completion; a reward model reads prompt and completion together
    scores = list(scorer.score_responses(queries, responses, batch["query"], batch["response"])[0].cpu())
    stats = trainer.step(queries, responses, scores)
    trainer.log_stats(stats, batch, scores)
    print(
        f"step {trainer.current_step}/{config.steps}: mean score {stats['ppo/mean_scores']:.4f}, "
        f"kl {stats['objective/kl']:.4f}, loss {stats['ppo/loss/total']:.4f}",
        flush=True,
    )
    return stats


def _train(trainer: PPOTrainer, scorer: Any, args: PPOScriptArguments, config: PPOCommandConfig) -> _Run:
    """PPO steps over the prompts until `config.steps`, checkpointing every --save_steps.

    A SIGINT/SIGTERM saves a checkpoint where --resume_from_checkpoint can find it, and ends the run.
    """
    run = _Run()
    # where the last good state goes if NaN steps stop the run
    trainer.checkpoint_dir = _checkpoint_folder(trainer, args)
    with trainer.graceful_stop:
        while trainer.current_step < config.steps:
            for batch in trainer.dataloader:
                stats = _ppo_step(trainer, scorer, batch, config, args.max_new_tokens)
                if run.first_mean_score is None:
                    run.first_mean_score = stats["ppo/mean_scores"]
                run.last_mean_score = stats["ppo/mean_scores"]
                if args.save_steps and trainer.current_step % args.save_steps == 0:
                    _save_checkpoint(trainer, args)
                if trainer.should_stop():
                    run.stopped_checkpoint = _save_checkpoint(trainer, args)
                    return run
                if trainer.current_step >= config.steps:
                    break
    return run


def _body(argv: list[str] | None) -> int:
    args, config, model_args, resume = parse_args(
        (PPOScriptArguments, PPOCommandConfig, ModelArguments, ResumeArguments),
        argv,
        PROG,
        "Classic PPO loop.",
    )
    _check_paths(args, model_args)  # before any model is loaded
    trust = resume.trust_unverified_checkpoint
    checkpoint = start_run(
        PROG, args.output_dir, args.resume_from_checkpoint, None, trust, max_steps=config.steps,
        max_steps_flag="--steps",
    )  # fmt: skip
    trainer, scorer = _build_trainer(args, config, model_args)
    if checkpoint is not None:  # warns about each setting that differs from the checkpoint's run
        trainer.load_checkpoint(str(checkpoint), trust_unverified_checkpoint=trust)
    run = _train(trainer, scorer, args, config)
    if run.stopped_checkpoint is not None:  # no final model for an unfinished run
        return stopped_early(PROG, trainer.graceful_stop, run.stopped_checkpoint, trainer.current_step)
    trainer.save_pretrained(args.output_dir)
    summary = {
        "output_dir": args.output_dir,
        "steps": trainer.current_step,
        "first_mean_score": run.first_mean_score,
        "last_mean_score": run.last_mean_score,
    }
    print(summary_json(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, _body, argv)
