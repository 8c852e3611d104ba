"""The decode loop's preallocated KV cache against transformers' `DynamicCache`."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicLayer

from rlhfkit.rollout import DecodeLoopBackend, SamplingParams, pad_left
from rlhfkit.rollout.kv_cache import PreallocatedLayer, decode_cache
from rlhfkit.testing import tiny_model_path


def kv(batch, length, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, length, 4, generator=g), torch.randn(batch, 2, length, 4, generator=g)


def test_the_layer_returns_what_a_dynamic_layer_returns_through_prefill_steps_and_row_drops():
    plain, preallocated = DynamicLayer(), PreallocatedLayer(capacity=9)
    for step, (length, keep) in enumerate([(5, None), (1, None), (1, torch.tensor([0, 2])), (1, None)]):
        if keep is not None:
            plain.batch_select_indices(keep)
            preallocated.batch_select_indices(keep)
        batch = 3 if step < 2 else 2
        k, v = kv(batch, length, seed=step)
        expected, got = plain.update(k, v), preallocated.update(k, v)
        for e, g in zip(expected, got):
            assert g.shape == e.shape
            assert torch.equal(g, e)
        assert preallocated.get_seq_length() == plain.get_seq_length() == 5 + step
    assert preallocated.key_buffer.shape == (2, 2, 9, 4)  # one allocation, cut to the kept rows once


def test_the_layer_refuses_to_grow_past_its_capacity():
    layer = PreallocatedLayer(capacity=4)
    layer.update(*kv(1, 4, seed=0))
    with pytest.raises(RuntimeError, match="capacity 4"):
        layer.update(*kv(1, 1, seed=1))


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_a_model_gives_the_same_logits_with_the_decode_cache(arch):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(arch)).eval()
    ids = torch.randint(2, 900, (3, 6), generator=torch.Generator().manual_seed(0))
    cache = decode_cache(model.config, capacity=10)
    assert all(isinstance(layer, PreallocatedLayer) for layer in cache.layers)
    caches = [DynamicCache(config=model.config), cache]
    with torch.no_grad():
        logits = [model(input_ids=ids, cache=c, use_cache=True).logits[:, -1] for c in caches]
        for _ in range(3):
            torch.testing.assert_close(logits[1], logits[0], atol=1e-6, rtol=1e-6)
            token = logits[0].argmax(-1, keepdim=True)
            logits = [model(input_ids=token, cache=c, use_cache=True).logits[:, -1] for c in caches]
    torch.testing.assert_close(logits[1], logits[0], atol=1e-6, rtol=1e-6)


def test_the_decode_loop_samples_through_the_preallocated_cache(monkeypatch):
    from rlhfkit.rollout import decoding

    made = []

    def spy(config, capacity):
        made.append(decode_cache(config, capacity))
        return made[-1]

    monkeypatch.setattr(decoding, "decode_cache", spy)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path("llama")).eval()
    g = torch.Generator().manual_seed(0)
    ids, mask = pad_left([torch.randint(2, 900, (n,), generator=g) for n in (4, 2)], 1)
    out = DecodeLoopBackend(model, 1).generate(ids, mask, SamplingParams(5, do_sample=False))
    assert out.responses.shape == (2, 5)
    assert len(made) == 1 and all(layer.capacity == 4 + 5 for layer in made[0].layers)
    assert made[0].layers[0].length == 4 + 4  # the last sampled token is never fed back
