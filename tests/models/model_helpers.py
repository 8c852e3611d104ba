"""Helpers shared by the model tests (a uniquely named module, importable next to the tests)."""

from __future__ import annotations

import torch
from peft import LoraConfig, TaskType

LORA_TARGETS = ["q_proj", "v_proj"]


def policy_lora(r: int = 4) -> LoraConfig:
    return LoraConfig(task_type=TaskType.CAUSAL_LM, r=r, lora_alpha=8, target_modules=LORA_TARGETS)


def pad_token_id() -> int:
    from rlhfkit.testing import tiny_tokenizer

    return tiny_tokenizer().pad_token_id


def batch(batch_size: int = 3, seq_len: int = 9, left_pad: bool = True, seed: int = 0):
    """Random token ids with ragged padding (row i has i pad tokens, filled with the pad id)."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, 900, (batch_size, seq_len), generator=gen)
    mask = torch.ones_like(input_ids)
    for i in range(batch_size):
        if i:
            if left_pad:
                mask[i, :i] = 0
            else:
                mask[i, -i:] = 0
    return input_ids.masked_fill(mask == 0, pad_token_id()), mask
