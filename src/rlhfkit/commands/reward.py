"""`rlhfkit reward`: train a reward model on preference pairs from a local dataset.

    rlhfkit reward --model_name_or_path ./tiny-llama-reward --dataset_name pairs.jsonl \
        --output_dir out/rm --max_steps 100 [--use_peft] [--config reward.yaml]
"""

from __future__ import annotations

import json

from rlhfkit.commands._args import (
    ModelArguments,
    ScriptArguments,
    load_data,
    load_model,
    load_tokenizer,
    parse_args,
    peft_config_from,
    run_main,
)

PROG = "rlhfkit reward"


def _run(argv: list[str] | None) -> int:
    from transformers import AutoModelForSequenceClassification

    from rlhfkit.trainers.reward import RewardTrainer
    from rlhfkit.trainers.reward_config import RewardConfig

    script_args, config, model_args = parse_args(
        (ScriptArguments, RewardConfig, ModelArguments), argv, PROG, "Train a reward model (Bradley-Terry)."
    )
    train_dataset, eval_dataset = load_data(script_args)
    tokenizer = load_tokenizer(model_args)
    model = load_model(model_args, AutoModelForSequenceClassification, num_labels=1)
    trainer = RewardTrainer(
        model=model,
        args=config,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=peft_config_from(model_args, "SEQ_CLS"),
    )
    trainer.train()
    trainer.save_model(config.output_dir)
    tokenizer.save_pretrained(config.output_dir)
    summary = {"output_dir": config.output_dir, "overlong": trainer.overlong_counts}
    if eval_dataset is not None:
        summary["eval"] = trainer.evaluate()
    print(json.dumps(summary, default=float))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, _run, argv)
