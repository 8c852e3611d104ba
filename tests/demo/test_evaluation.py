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


def test_second_judge_win_rate_on_fixed_texts():
    from rlhfkit.demo.evaluation import second_judge_metrics
    from rlhfkit.tasks.polarity import PolarityClassifier

    # P(positive) = sigmoid(2 * (#good - #bad)): features other than the two words are ignored
    classifier = PolarityClassifier(["bad", "good"], torch.tensor([-2.0, 2.0]), 0.0)
    rl = ["good", "bad", "good good", "so so"]
    sft = ["bad", "good", "good", "so so"]
    metrics, rl_scores, sft_scores = second_judge_metrics(["p"] * 4, rl, sft, classifier)
    assert rl_scores == pytest.approx([torch.sigmoid(torch.tensor(v)).item() for v in (2.0, -2.0, 4.0, 0.0)])
    # win, loss, win, tie -> (2 + 0.5) / 4 = 0.625, the interval of test_judgements_from_gold_scores...
    assert metrics["win_rate_rl_vs_sft_classifier"] == pytest.approx(0.625)
    low, high = metrics["win_rate_classifier_ci95"]
    assert low == pytest.approx(0.2194, abs=1e-3) and high == pytest.approx(0.9081, abs=1e-3)
    assert metrics["classifier_score_rl"] == pytest.approx(sum(rl_scores) / 4)
    assert sum(sft_scores) / 4 == pytest.approx(metrics["classifier_score_sft"])


def test_two_judges_disagreeing_is_said_plainly():
    from rlhfkit.demo.evaluation import distinct_2, judges_verdict
    from rlhfkit.demo.report import judges_sentence

    assert judges_verdict(0.8, 0.7, 0.9) == "better" and judges_verdict(0.45, 0.3, 0.6) == "no difference"
    assert judges_verdict(0.2, 0.1, 0.3) == "worse"
    ev = {"win_rate_rl_vs_sft": 0.8, "win_rate_ci95": [0.7, 0.9]}
    ev |= {"win_rate_rl_vs_sft_classifier": 0.5, "win_rate_classifier_ci95": [0.4, 0.6]}
    text = judges_sentence("rloo", ev)
    assert text.startswith("The judges disagree") and "beats SFT" in text and "not told apart" in text
    ev["win_rate_classifier_ci95"] = [0.55, 0.7]
    assert judges_sentence("rloo", ev).startswith("Both judges agree: rloo beats SFT")
    # "a b a b" has pairs (a b), (b a), (a b): 2 distinct of 3; "c" has none
    assert distinct_2(["a b a b", "c"]) == pytest.approx(2 / 3) and distinct_2(["c"]) == 0.0
