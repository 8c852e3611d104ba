"""The classic PPO loop (TRL's PPO walkthrough with `rlhfkit` imports) on a built-in task, offline on a CPU.

    python examples/ppo.py                                   # tiny llama, "length" task, ~1 minute
    python examples/ppo.py --task keyword --steps 40
    python examples/ppo.py --reward_model ./my-reward-model  # score with a local reward model instead

Each step: take a batch of prompts from `trainer.dataloader`, sample responses with `trainer.generate`,
score them, and call `trainer.step(queries, responses, scores)`. Any model folder works in place of the
tiny one (`--model_name_or_path`); nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import AutoModelForSequenceClassification, AutoTokenizer, HfArgumentParser

from rlhfkit import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
from rlhfkit.rewards.scoring import RewardScorer
from rlhfkit.tasks import get_task
from rlhfkit.testing import tiny_model_path


@dataclass
class ExampleArguments:
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Policy folder (default: tiny llama)."}
    )
    task: str = field(
        default="length", metadata={"help": "Built-in task: prompts and (by default) the reward."}
    )
    reward_model: str | None = field(default=None, metadata={"help": "Local reward-model folder (optional)."})
    steps: int = field(default=25, metadata={"help": "PPO steps."})
    batch_size: int = field(default=32, metadata={"help": "Prompts per step."})
    learning_rate: float = field(default=1e-3, metadata={"help": "High, because the tiny model is random."})
    max_new_tokens: int = field(default=8, metadata={"help": "Longest response."})
    output_dir: str = field(default="ppo-example-model", metadata={"help": "Where the model is saved."})


def main() -> None:
    (args,) = HfArgumentParser(ExampleArguments).parse_args_into_dataclasses()
    model_path = args.model_name_or_path or str(tiny_model_path("llama"))

    # 1. configuration, model (with a value head) and tokenizer; the reference model is made for us
    config = PPOConfig(
        model_name=model_path,
        query_dataset=args.task,
        learning_rate=args.learning_rate,
        batch_size=args.batch_size,
        mini_batch_size=args.batch_size // 2,
        init_kl_coef=0.05,
    )
    model = AutoModelForCausalLMWithValueHead.from_pretrained(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token

    # 2. prompts, pretokenised into "input_ids"
    task = get_task(args.task)
    dataset = task.prompt_dataset("train")
    dataset = dataset.map(lambda sample: {"input_ids": tokenizer.encode(sample["query"])})

    # 3. the reward: the task's own function on the completion, or a reward model on prompt + completion
    #    (its own tokenizer re-encodes the text); one RewardScorer handles both
    if args.reward_model is None:
        source, reward_tokenizer = task.text_reward("--task", "PPO's reward"), None
    else:
        source = AutoModelForSequenceClassification.from_pretrained(args.reward_model, num_labels=1)
        reward_tokenizer = AutoTokenizer.from_pretrained(args.reward_model, padding_side="left")
    scorer = RewardScorer(source, tokenizer, reward_tokenizer, add_special_tokens=True)

    ppo_trainer = PPOTrainer(config, model, tokenizer=tokenizer, dataset=dataset)
    generation_kwargs = {
        "min_length": -1,
        "top_k": 0.0,
        "top_p": 1.0,
        "do_sample": True,
        "pad_token_id": tokenizer.pad_token_id,
        "max_new_tokens": args.max_new_tokens,
    }

    # 4. the loop: generate -> score -> step
    while ppo_trainer.current_step < args.steps:
        for batch in ppo_trainer.dataloader:
            query_tensors = batch["input_ids"]
            response_tensors = ppo_trainer.generate(
                query_tensors, return_prompt=False, batch_size=args.batch_size, **generation_kwargs
            )
            batch["response"] = tokenizer.batch_decode(response_tensors, skip_special_tokens=True)
            scores, _ = scorer.score_responses(
                query_tensors, response_tensors, batch["query"], batch["response"]
            )
            rewards = list(scores)
            stats = ppo_trainer.step(query_tensors, response_tensors, rewards)
            ppo_trainer.log_stats(stats, batch, rewards)
            print(
                f"step {ppo_trainer.current_step:3d}  mean score {stats['ppo/mean_scores']:+.3f}  "
                f"kl {stats['objective/kl']:+.3f}  e.g. {batch['response'][0]!r}"
            )
            if ppo_trainer.current_step >= args.steps:
                break

    ppo_trainer.save_model(args.output_dir)
    print(f"saved to {args.output_dir}")


if __name__ == "__main__":
    main()
