"""RLOO on a built-in toy task with the offline tiny models: the policy learns to say "e" more often.

    python examples/rloo.py                                  # defaults below, about a minute on a laptop CPU
    python examples/rloo.py --total_episodes 2000 --rloo_k 4 # any RLOOConfig / TrainingArguments flag

For real models and data use the command line instead: `rlhfkit rloo --help`.
"""

from __future__ import annotations

import sys

from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

from rlhfkit import RLOOConfig, RLOOTrainer
from rlhfkit.rewards import KeywordReward
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model_path

DEFAULTS = dict(
    output_dir="runs/rloo-keyword",
    report_to="none",
    per_device_train_batch_size=16,
    rloo_k=4,
    num_ppo_epochs=1,
    total_episodes=480,
    response_length=6,
    learning_rate=3e-3,
    temperature=1.0,
    kl_coef=0.01,
    lr_scheduler_type="constant",
    logging_steps=5,
    num_sample_generations=3,
    save_strategy="no",
)


def main(argv: list[str]) -> None:
    parser = HfArgumentParser(RLOOConfig)
    parser.set_defaults(**DEFAULTS)
    (config,) = parser.parse_args_into_dataclasses(args=argv)

    path = tiny_model_path("llama")  # built once, offline, then cached
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    policy = AutoModelForCausalLM.from_pretrained(path)
    ref_policy = AutoModelForCausalLM.from_pretrained(path)

    trainer = RLOOTrainer(
        config=config,
        processing_class=tokenizer,
        policy=policy,
        ref_policy=ref_policy,
        reward_model=KeywordReward("e"),  # any callable list[str] -> list[float] works
        train_dataset=toy_prompt_dataset("train"),
        eval_dataset=toy_prompt_dataset("test", n=4),
    )
    trainer.train()
    trainer.save_model(config.output_dir)
    trainer.create_model_card(dataset_name="keyword")
    scores = [h["objective/scores"] for h in trainer.state.log_history if "objective/scores" in h]
    print(f"objective/scores: first log {scores[0]:.2f}, last log {scores[-1]:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
