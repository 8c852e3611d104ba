"""The real-shape workload (benchmarks/real_shape.py) is Qwen2.5-0.5B's architecture: built on the meta
device (no memory, no weights), it has that model's 494,032,768 parameters; the state floor is five copies of
them."""

from __future__ import annotations

import torch
from test_harness import _load
from transformers import Qwen2Config, Qwen2ForCausalLM


def test_the_real_shape_has_qwen2_5_0_5b_parameter_count_and_floor():
    prepare, real_shape = _load("prepare"), _load("real_shape")
    vocab = prepare.VOCAB_SIZES[real_shape.MODEL]
    ids = dict(vocab_size=vocab, bos_token_id=0, eos_token_id=0, pad_token_id=1)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**ids, **prepare.REAL_SHAPES[real_shape.MODEL]))
    params = sum(p.numel() for p in model.parameters())  # tied: the head is the embedding
    assert params == 494_032_768
    # weights, gradients, two AdamW moments, the reference: 5 x 4 bytes a parameter
    assert real_shape._state_floor_mib(model) == 5 * 4 * params / 2**20
