"""Win rate, its interval, KL and learned scores of the evaluation stage."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.demo.evaluation import kl_to_reference, learned_scores, win_rate, win_rate_interval
from rlhfkit.demo.sampling import sample_completions
from rlhfkit.testing import tiny_model, tiny_tokenizer


def test_win_rate_counts_ties_half():
    # pairs: win, tie, loss, win -> (1 + 0.5 + 0 + 1) / 4 = 0.625
    assert win_rate([0.9, 0.2, -0.1, 0.5], [0.1, 0.2, 0.3, -0.5]) == pytest.approx(0.625)
    assert win_rate([0.0, 0.0], [0.0, 0.0]) == 0.5


def test_win_rate_rejects_mismatched_lists():
    with pytest.raises(ValueError, match="equally long"):
        win_rate([1.0], [1.0, 2.0])


def test_win_rate_interval():
    # p = 0.5, n = 100: half width 1.96 * sqrt(0.25 / 100) = 0.098
    low, high = win_rate_interval(0.5, 100)
    assert low == pytest.approx(0.402) and high == pytest.approx(0.598)
    assert win_rate_interval(1.0, 10) == (1.0, 1.0)


@pytest.fixture(scope="module")
def samples_and_model():
    tokenizer = tiny_tokenizer(padding_side="left")
    model = tiny_model("llama").eval()
    samples = sample_completions(
        model, tokenizer, ["The film was", "I watched this movie on"], 6, 1.0, seed=0
    )
    return tokenizer, model, samples


def test_sampling_is_seeded_and_shaped(samples_and_model):
    tokenizer, model, samples = samples_and_model
    again = sample_completions(model, tokenizer, samples.prompts, 6, 1.0, seed=0)
    assert torch.equal(samples.responses, again.responses)
    assert samples.responses.shape == (2, 6) and samples.response_mask.dtype == torch.bool
    assert samples.reviews()[0].startswith("The film was")


def test_kl_to_itself_is_zero_and_to_another_model_is_not(samples_and_model):
    _, model, samples = samples_and_model
    assert kl_to_reference(model, model, samples, temperature=1.0) == pytest.approx([0.0, 0.0], abs=1e-5)
    other = tiny_model("llama").eval()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    values = kl_to_reference(model, other, samples, temperature=1.0)
    assert all(math.isfinite(v) for v in values) and any(abs(v) > 1e-3 for v in values)


def test_learned_scores_one_per_sample(samples_and_model):
    _, _, samples = samples_and_model
    scores = learned_scores(tiny_model("llama-reward").eval(), samples)
    assert len(scores) == 2 and all(math.isfinite(s) for s in scores)
