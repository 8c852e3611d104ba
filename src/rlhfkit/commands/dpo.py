"""`rlhfkit dpo`: direct preference optimisation on a local prompt/chosen/rejected dataset.

    rlhfkit dpo --model_name_or_path ./tiny-llama --dataset_name pairs.jsonl --output_dir out/dpo \
        --max_steps 100 --beta 0.1 [--loss_type ipo] [--use_peft] [--config dpo.yaml]
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

PROG = "rlhfkit dpo"


def _run(argv: list[str] | None) -> int:
    from transformers import AutoModelForCausalLM

    from rlhfkit.trainers.dpo import DPOTrainer
    from rlhfkit.trainers.dpo_config import DPOConfig

    script_args, config, model_args = parse_args(
        (ScriptArguments, DPOConfig, ModelArguments), argv, PROG, "Direct preference optimisation."
    )
    train_dataset, eval_dataset = load_data(script_args)
    tokenizer = load_tokenizer(model_args)
    model = load_model(model_args, AutoModelForCausalLM)
    trainer = DPOTrainer(
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
    logged = [h for h in trainer.state.log_history if "rewards/accuracies" in h]
    summary = {"output_dir": config.output_dir, "last_log": logged[-1] if logged else None}
    if eval_dataset is not None:
        summary["eval"] = trainer.evaluate()
    print(json.dumps(summary, default=float))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, _run, argv)
