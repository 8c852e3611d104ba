"""The second review judge: a classifier trained on the generator's own labels, seeded and saved."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.judges import RuleJudge
from rlhfkit.tasks.polarity import PolarityClassifier, features, polarity_training_reviews
from rlhfkit.tasks.reviews import prompt_split, review_records


@pytest.fixture(scope="module")
def classifier():
    return PolarityClassifier.train(polarity_training_reviews(2000, seed=11), seed=0)


def test_features_are_words_and_adjacent_pairs():
    assert features("Not good, really!") == [
        "not",
        "good",
        ",",
        "really",
        "!",
        "not good",
        "good ,",
        ", really",
        "really !",
    ]


def test_training_reviews_avoid_test_split_openings():
    records = polarity_training_reviews(300, seed=3)
    assert len(records) == 300 and all(prompt_split(text) == "train" for text, _ in records)
    assert {label for _, label in records} == {"positive", "negative"}


def test_heldout_accuracy_on_generator_reviews(classifier):
    # measured: 0.96 on 2000 reviews of another generator seed (0.97 with 4000 training reviews)
    seen = {text for text, _ in polarity_training_reviews(2000, seed=11)}
    heldout = [r for r in review_records(1000, seed=12) if r[0] not in seen]
    assert classifier.accuracy(heldout) > 0.93


def test_same_seed_same_weights_and_save_load_round_trip(classifier, tmp_path):
    again = PolarityClassifier.train(polarity_training_reviews(2000, seed=11), seed=0)
    assert again.vocab == classifier.vocab and torch.equal(again.weight, classifier.weight)
    classifier.save(tmp_path)
    loaded = PolarityClassifier.load(tmp_path)
    texts = ["A wonderful, moving film.", "A dull and tedious movie."]
    assert loaded(texts) == classifier(texts)
    with pytest.raises(FileNotFoundError, match="no polarity classifier"):
        PolarityClassifier.load(tmp_path / "missing")


def test_probabilities_and_pairwise_judge(classifier):
    good, bad = "The acting was wonderful and the ending was brilliant.", "The acting was awful and dull."
    p_good, p_bad = classifier([good, bad])
    assert 0.5 < p_good <= 1.0 and 0.0 <= p_bad < 0.5
    judge = RuleJudge.of_texts(classifier)
    assert judge.judge(["p", "p", "p"], [[bad, good], [good, bad], [good, good]]) == [1, 0, -1]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="positive' or 'negative"):
        PolarityClassifier.train([("text", "neutral")])
    with pytest.raises(TypeError, match="single str"):
        PolarityClassifier(["a"], torch.zeros(1), 0.0)("a")
