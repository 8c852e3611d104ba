"""Trainers tag the model they train (`model.model_tags`, written into the model card on `push_to_hub`):
rlhfkit's library tag and TRL 1.x's tag of the trainer, once each, beside the model's own tags."""

from __future__ import annotations

import datasets
import pytest
from peft import LoraConfig

from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.testing.training_args import few_step_args
from rlhfkit.trainers.dpo import DPOConfig, DPOTrainer
from rlhfkit.trainers.reward_model import RewardConfig, RewardTrainer
from rlhfkit.trainers.sft import SFTConfig, SFTTrainer

PAIRS = [{"prompt": "Q: hi ", "chosen": "fine thanks", "rejected": "no"}]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(padding_side="right")


@pytest.mark.parametrize("peft", [False, True])
def test_sft_and_dpo_tag_their_model_beside_its_own_tags(tmp_path, tok, peft):
    peft_config = LoraConfig(r=2, target_modules=["q_proj"]) if peft else None
    model = tiny_model("llama")
    model.add_model_tags(["mine"])
    rows = datasets.Dataset.from_list([{"text": "a cat sat"}])
    sft = SFTTrainer(
        model=model, args=few_step_args(SFTConfig, tmp_path / "s"), train_dataset=rows, processing_class=tok,
        peft_config=peft_config,
    )  # fmt: skip
    assert sft.model.model_tags == ["mine", "rlhfkit", "sft"]
    pairs = datasets.Dataset.from_list(PAIRS)
    dpo = DPOTrainer(
        model=tiny_model("llama"), args=few_step_args(DPOConfig, tmp_path / "d"), train_dataset=pairs,
        processing_class=tok, peft_config=peft_config,
    )  # fmt: skip
    assert dpo.model.model_tags == ["rlhfkit", "dpo"]


def test_reward_trainer_tags_its_model(tmp_path, tok):
    pairs = datasets.Dataset.from_list(PAIRS)
    reward = RewardTrainer(
        model=tiny_model("llama-reward"), args=few_step_args(RewardConfig, tmp_path / "r"),
        train_dataset=pairs, processing_class=tok,
    )  # fmt: skip
    assert reward.model.model_tags == ["rlhfkit", "reward-trainer"]
