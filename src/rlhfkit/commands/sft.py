"""`rlhfkit sft`: supervised fine-tuning of a causal language model on a local dataset.

    rlhfkit sft --model_name_or_path ./tiny-llama --dataset_name docs.jsonl --output_dir out/sft \
        --max_steps 100 [--packing] [--completion_only_loss] [--use_peft] [--config sft.yaml]
"""

from __future__ import annotations

from rlhfkit.commands._args import TrainerCommand

COMMAND = TrainerCommand(
    "rlhfkit sft",
    "Supervised fine-tuning.",
    trainer="rlhfkit.trainers.sft.trainer:SFTTrainer",
    config="rlhfkit.trainers.sft.config:SFTConfig",
    auto_model="AutoModelForCausalLM",
    peft_task_type="CAUSAL_LM",
    summary=lambda trainer: {"train_loss": trainer.state.log_history[-1].get("train_loss")},
)
main = COMMAND.main
