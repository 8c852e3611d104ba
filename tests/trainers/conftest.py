"""Fixtures for the trainers' tests: forcing the chunked log-prob path on the tiny models."""

from __future__ import annotations

import pytest

from rlhfkit.core import logprobs as core_logprobs
from rlhfkit.core.chunked_logprobs import CHUNK_SHARE
from rlhfkit.rollout import lm_head, scoring


@pytest.fixture
def chunk_calls(monkeypatch):
    """Route every batch through the chunked path, 3 rows a chunk; the list holds the rows of each call."""
    monkeypatch.setattr(scoring, "CHUNK_ELEMENTS", 8)  # every batch's logits now outgrow "one chunk"
    # 3 rows of the 1,000-token vocabulary per chunk on the lm-head path (a CHUNK_SHARE of the budget)
    monkeypatch.setattr(core_logprobs, "CHUNK_ELEMENTS", 3 * 1000 * CHUNK_SHARE)
    calls: list[int] = []
    real = lm_head.chunked_token_logprobs

    def counted(hidden, *args, **kwargs):
        calls.append(hidden.shape[0])
        return real(hidden, *args, **kwargs)

    monkeypatch.setattr(lm_head, "chunked_token_logprobs", counted)
    return calls


@pytest.fixture
def unplain_head_model(monkeypatch):
    """A tiny Llama whose head is not a plain nn.Linear (same logits), with the logged fallbacks forgotten."""
    from torch import nn

    from rlhfkit.testing import tiny_model

    model = tiny_model("llama")
    model.lm_head = nn.Sequential(model.lm_head)
    monkeypatch.setattr(lm_head, "_logged_fallbacks", set())  # earlier tests may have logged this reason
    return model
