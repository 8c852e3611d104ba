"""`rlhfkit sft`: supervised fine-tuning of a causal language model on a local dataset.

    rlhfkit sft --model_name_or_path ./tiny-llama --dataset_name docs.jsonl --output_dir out/sft \
        --max_steps 100 [--packing [--packing_strategy bfd|bfd_split|wrapped]] [--padding_free] \
        [--completion_only_loss true|false] [--assistant_only_loss --chat_template_path chat.jinja] \
        [--truncation_mode keep_end] [--use_peft] [--config sft.yaml]

Every SFTConfig field is a flag. The summary line reports the train loss and the last logged
mean_token_accuracy and num_tokens.
"""

from __future__ import annotations

from rlhfkit.commands._args import TrainerCommand


def last_logged(history: list[dict], keys: tuple[str, ...]) -> dict:
    """The last logged value of each of `keys` (a key never logged is left out)."""
    return {key: next((h[key] for h in reversed(history) if key in h), None) for key in keys}


COMMAND = TrainerCommand(
    "rlhfkit sft",
    "Supervised fine-tuning.",
    trainer="rlhfkit.trainers.sft.trainer:SFTTrainer",
    config="rlhfkit.trainers.sft.config:SFTConfig",
    auto_model="AutoModelForCausalLM",
    peft_task_type="CAUSAL_LM",
    summary=lambda trainer: {
        "train_loss": trainer.state.log_history[-1].get("train_loss"),
        **last_logged(trainer.state.log_history, ("mean_token_accuracy", "num_tokens")),
    },
)
main = COMMAND.main
