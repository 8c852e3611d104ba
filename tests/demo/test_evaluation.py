"""Win rate, its interval, KL and learned scores of the evaluation stage."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.demo.evaluation import judgements, kl_to_reference, learned_scores
from rlhfkit.demo.sampling import sample_completions
from rlhfkit.judges import TIE, win_rate
from rlhfkit.testing import tiny_model, tiny_tokenizer


def test_judgements_from_gold_scores_and_their_win_rate():
    # pairs [sft, rl]: win, tie, loss, win -> (1 + 0.5 + 0 + 1) / 4 = 0.625, Wilson interval on n = 4
    verdicts = judgements([0.9, 0.2, -0.1, 0.5], [0.1, 0.2, 0.3, -0.5])
    assert verdicts == [1, TIE, 0, 1]
    rate, low, high = win_rate(verdicts, model_index=1)
    assert rate == pytest.approx(0.625)
    # centre (0.625 + 3.8415/8) / (1 + 3.8415/4) = 0.5638; half 1.96/1.9604 * sqrt(0.05859 + 0.06002) = 0.3443
    assert low == pytest.approx(0.2194, abs=1e-3) and high == pytest.approx(0.9081, abs=1e-3)
    assert judgements([0.0, 0.0], [0.0, 0.0]) == [TIE, TIE]


def test_judgements_reject_mismatched_lists():
    with pytest.raises(ValueError, match="equally long"):
        judgements([1.0], [1.0, 2.0])


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
