"""`rlhfkit reward`: train a reward model on preference pairs from a local dataset.

    rlhfkit reward --model_name_or_path ./tiny-llama-reward --dataset_name pairs.jsonl \
        --output_dir out/rm --max_steps 100 [--use_peft] [--config reward.yaml]
"""

from __future__ import annotations

from rlhfkit.commands._args import TrainerCommand

COMMAND = TrainerCommand(
    "rlhfkit reward",
    "Train a reward model (Bradley-Terry).",
    trainer="rlhfkit.trainers.reward_model.trainer:RewardTrainer",
    config="rlhfkit.trainers.reward_model.config:RewardConfig",
    auto_model="AutoModelForSequenceClassification",
    peft_task_type="SEQ_CLS",
    model_kwargs={"num_labels": 1},
    summary=lambda trainer: {"overlong": trainer.overlong_counts},
)
main = COMMAND.main
