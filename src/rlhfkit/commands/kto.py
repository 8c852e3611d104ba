"""`rlhfkit kto`: Kahneman-Tversky optimisation on a local dataset of labelled completions.

    rlhfkit kto --model_name_or_path ./tiny-llama --dataset_name rows.jsonl --output_dir out/kto \
        --max_steps 100 --beta 0.1 [--loss_type apo_zero_unpaired] [--use_peft] [--config kto.yaml]

Rows hold prompt / completion / label (True = desirable); prompt / chosen / rejected pairs are unpaired.
"""

from __future__ import annotations

from typing import Any

from rlhfkit.commands._args import TrainerCommand


def _last_log(trainer: Any) -> dict[str, Any]:
    logged = [h for h in trainer.state.log_history if "kl" in h]
    return {"last_log": logged[-1] if logged else None}


COMMAND = TrainerCommand(
    "rlhfkit kto",
    "Kahneman-Tversky optimisation on unpaired, labelled completions.",
    trainer="rlhfkit.trainers.kto.trainer:KTOTrainer",
    config="rlhfkit.trainers.kto.config:KTOConfig",
    auto_model="AutoModelForCausalLM",
    peft_task_type="CAUSAL_LM",
    summary=_last_log,
)
main = COMMAND.main
