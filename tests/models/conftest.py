"""Shared fixtures: tiny offline models, a LoRA reward adapter and an SFT LoRA built on them."""

from __future__ import annotations

import pytest
import torch
from model_helpers import LORA_TARGETS
from peft import LoraConfig, TaskType, get_peft_model

from rlhfkit.testing import tiny_model, tiny_model_path


@pytest.fixture(scope="session")
def llama_path():
    return tiny_model_path("llama")


@pytest.fixture(scope="session")
def reward_adapter_dir(tmp_path_factory):
    """A LoRA reward model trained (here: randomly perturbed) on the tiny llama base, saved the way
    RewardTrainer saves it: PeftModel.save_pretrained of a SEQ_CLS model, score head via modules_to_save."""
    torch.manual_seed(1)
    base = tiny_model("llama-reward")
    model = get_peft_model(
        base,
        LoraConfig(task_type=TaskType.SEQ_CLS, r=4, target_modules=LORA_TARGETS, init_lora_weights=False),
    )
    folder = tmp_path_factory.mktemp("reward_adapter")
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def sft_adapter_dir(tmp_path_factory, llama_path):
    """An 'SFT' LoRA: non-zero adapter weights, so the SFT model differs from the bare base."""
    torch.manual_seed(2)
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(llama_path)
    model = get_peft_model(
        base,
        LoraConfig(task_type=TaskType.CAUSAL_LM, r=4, target_modules=LORA_TARGETS, init_lora_weights=False),
    )
    folder = tmp_path_factory.mktemp("sft_adapter")
    model.save_pretrained(folder)
    return folder
