"""`rlhfkit dpo`: direct preference optimisation on a local prompt/chosen/rejected dataset.

    rlhfkit dpo --model_name_or_path ./tiny-llama --dataset_name pairs.jsonl --output_dir out/dpo \
        --max_steps 100 --beta 0.1 [--loss_type ipo] [--use_peft] [--config dpo.yaml]
"""

from __future__ import annotations

from typing import Any

from rlhfkit.commands._args import TrainerCommand


def _last_log(trainer: Any) -> dict[str, Any]:
    logged = [h for h in trainer.state.log_history if "rewards/accuracies" in h]
    return {"last_log": logged[-1] if logged else None}


COMMAND = TrainerCommand(
    "rlhfkit dpo",
    "Direct preference optimisation.",
    trainer="rlhfkit.trainers.dpo.trainer:DPOTrainer",
    config="rlhfkit.trainers.dpo.config:DPOConfig",
    auto_model="AutoModelForCausalLM",
    peft_task_type="CAUSAL_LM",
    summary=_last_log,
)
main = COMMAND.main
