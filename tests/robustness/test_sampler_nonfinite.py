"""The decode loop stops with a clear error when the policy's logits are NaN or infinite (a diverged or
corrupt policy), naming the step, instead of an index error deep in the sampler or a silent garbage token."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.rollout import SamplingParams
from rlhfkit.rollout.decoding import DecodeLoopBackend, NonFiniteLogitsError
from rlhfkit.testing import tiny_model, tiny_tokenizer


def _poison_from(model, call: int, value: float):
    """Make the LM head's output `value` everywhere from its `call`-th forward on (0: the prefill)."""
    calls = {"n": 0}

    def hook(module, inputs, output):
        calls["n"] += 1
        return output if calls["n"] <= call else torch.full_like(output, value)

    return model.lm_head.register_forward_hook(hook)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("do_sample", [True, False])
def test_non_finite_logits_name_the_step(value, do_sample):
    tokenizer = tiny_tokenizer(padding_side="left")
    model = tiny_model("llama").eval()
    backend = DecodeLoopBackend(model, tokenizer.pad_token_id)
    batch = tokenizer(["the movie was", "a story"], return_tensors="pt", padding=True)
    params = SamplingParams(6, do_sample=do_sample, stop_token_ids=(2,))  # a role marker: no row ends early
    _poison_from(model, 2, value)
    with pytest.raises(NonFiniteLogitsError, match=r"non-finite logits .* at decoding step 2"):
        backend.generate(batch["input_ids"], batch["attention_mask"], params)


def test_finite_logits_decode_as_before():
    tokenizer = tiny_tokenizer(padding_side="left")
    model = tiny_model("llama").eval()
    backend = DecodeLoopBackend(model, tokenizer.pad_token_id)
    batch = tokenizer(["the movie was"], return_tensors="pt")
    out = backend.generate(
        batch["input_ids"], batch["attention_mask"], SamplingParams(4, stop_token_ids=(2,))
    )
    assert out.responses.shape == (1, 4)
