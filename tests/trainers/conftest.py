"""Fixtures for the trainers' tests: forcing the chunked log-prob path on the tiny models."""

from __future__ import annotations

import pytest

from rlhfkit.core import chunked_logprobs
from rlhfkit.rollout import lm_head, scoring


@pytest.fixture
def chunk_calls(monkeypatch):
    """Route every batch through the chunked path, 3 rows a row group; the list holds the rows of each
    call."""
    monkeypatch.setattr(scoring, "CHUNKED_HEAD_MIN_LOGITS", 8)  # every batch now takes the chunked head
    # row groups of 3 on the lm-head path
    monkeypatch.setattr(chunked_logprobs, "ROW_GROUP", 3)
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
