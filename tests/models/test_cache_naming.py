"""The KV cache's argument and output name on both sides of transformers 5.23's rename."""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from rlhfkit.models.cache_naming import cache_keyword, returned_cache


class _NewName(nn.Module):
    def forward(self, input_ids, cache=None):
        return input_ids


class _OldName(nn.Module):
    def forward(self, input_ids, past_key_values=None, **kwargs):
        return input_ids


def test_cache_keyword_follows_the_forward_signature():
    assert cache_keyword(_NewName()) == "cache"
    assert cache_keyword(_OldName()) == "past_key_values"


def test_returned_cache_reads_either_name_and_none_when_absent():
    cache = object()
    assert returned_cache({"cache": cache, "logits": 1}) is cache
    assert returned_cache({"past_key_values": cache}) is cache
    assert returned_cache({"logits": 1}) is None
    assert returned_cache(CausalLMOutputWithPast(logits=torch.zeros(1))) is None
