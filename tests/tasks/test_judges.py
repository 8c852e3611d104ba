"""VADER judge sanity, agreement with the corpus labels, and preference-pair labelling."""

from __future__ import annotations

import sys

import pytest

from rlhfkit.data.preference import label_preference_pairs
from rlhfkit.rewards import SentimentJudge
from rlhfkit.tasks import review_prompts, review_records

pytest.importorskip("vaderSentiment")


@pytest.fixture(scope="module")
def judge():
    return SentimentJudge()


def test_clear_sentiment_gets_a_clear_sign(judge):
    positive, negative, neutral = judge(
        [
            "What a wonderful, beautiful film. I loved every minute of it.",
            "A terrible, boring movie. I hated every minute of it.",
            "The film runs about two hours.",
        ]
    )
    assert positive > 0.3
    assert negative < -0.3
    assert neutral == 0.0
    assert all(isinstance(s, float) for s in (positive, negative, neutral))


def test_judge_rejects_a_bare_string(judge):
    with pytest.raises(TypeError, match="list of strings"):
        judge("a wonderful film")


def test_corpus_has_mixed_sentiment_and_neutral_prompts(judge):
    records = review_records(2000, seed=0)
    scores = judge([text for text, _ in records])
    n_pos, n_neg = sum(s > 0.05 for s in scores), sum(s < -0.05 for s in scores)
    # roughly balanced: each side holds at least a third of the corpus
    assert n_pos > len(scores) / 3 and n_neg > len(scores) / 3
    # the judge mostly agrees with the label the generator meant
    agree = sum((s > 0.05) == (label == "positive") for s, (_, label) in zip(scores, records))
    assert agree / len(records) > 0.8
    # prompts are openings without sentiment words, so the continuation decides the score
    prompt_scores = judge(review_prompts("train") + review_prompts("test"))
    assert sum(abs(s) < 0.05 for s in prompt_scores) / len(prompt_scores) > 0.95


def test_missing_vader_gives_an_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "vaderSentiment", None)
    monkeypatch.setitem(sys.modules, "vaderSentiment.vaderSentiment", None)
    with pytest.raises(ImportError, match=r"pip install 'rlhfkit\[demo\]'"):
        SentimentJudge()


def test_pairs_keep_the_higher_scored_completion_and_drop_ties():
    # a hand-made judge: score = number of "!" in the text
    def judge(texts):
        return [float(t.count("!")) for t in texts]

    pairs = label_preference_pairs(["p1", "p2", "p3"], ["a!!", "b", "c!"], ["a!", "b!!!", "d!"], judge)
    assert pairs.column_names == ["prompt", "chosen", "rejected"]
    # p1: 2 > 1 keeps a; p2: 0 < 3 keeps b's rival; p3: 1 == 1 is a tie and is dropped
    assert pairs["prompt"] == ["p1", "p2"]
    assert pairs["chosen"] == ["a!!", "b!!!"]
    assert pairs["rejected"] == ["a!", "b"]
    assert "1 ties dropped" in pairs.info.description


def test_pairs_with_vader(judge):
    good, bad = "a wonderful, delightful film", "a dull, awful film"
    pairs = label_preference_pairs(["x", "y"], [bad, good], [good, bad], judge)
    assert pairs["chosen"] == [good, good] and pairs["rejected"] == [bad, bad]


def test_pairs_need_equal_lengths():
    with pytest.raises(ValueError, match="same length"):
        label_preference_pairs(["p"], ["a", "b"], ["c"], lambda texts: [0.0] * len(texts))
