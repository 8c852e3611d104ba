"""`rlhfkit sft`: supervised fine-tuning of a causal language model on a local dataset.

    rlhfkit sft --model_name_or_path ./tiny-llama --dataset_name docs.jsonl --output_dir out/sft \
        --max_steps 100 [--packing] [--completion_only_loss] [--use_peft] [--config sft.yaml]
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

PROG = "rlhfkit sft"


def _run(argv: list[str] | None) -> int:
    from transformers import AutoModelForCausalLM

    from rlhfkit.trainers.sft import SFTTrainer
    from rlhfkit.trainers.sft_config import SFTConfig

    script_args, config, model_args = parse_args(
        (ScriptArguments, SFTConfig, ModelArguments), argv, PROG, "Supervised fine-tuning."
    )
    train_dataset, eval_dataset = load_data(script_args)
    tokenizer = load_tokenizer(model_args)
    model = load_model(model_args, AutoModelForCausalLM)
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=peft_config_from(model_args, "CAUSAL_LM"),
    )
    trainer.train()
    trainer.save_model(config.output_dir)
    tokenizer.save_pretrained(config.output_dir)
    summary = {"output_dir": config.output_dir, "train_loss": trainer.state.log_history[-1].get("train_loss")}
    if eval_dataset is not None:
        summary["eval"] = trainer.evaluate()
    print(json.dumps(summary, default=float))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, _run, argv)
