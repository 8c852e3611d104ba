"""The synthetic review corpus: deterministic, distinct, bounded, mixed in sentiment; prompts split
cleanly."""

from __future__ import annotations

import pytest

from rlhfkit.tasks import (
    prompt_split,
    review_corpus,
    review_prompt_dataset,
    review_prompts,
    review_records,
    review_sft_dataset,
)


def test_corpus_is_deterministic_and_prefix_stable():
    corpus = review_corpus(5000, seed=0)
    assert corpus == review_corpus(5000, seed=0)
    # the first k reviews do not depend on how many were asked for
    assert review_corpus(100, seed=0) == corpus[:100]
    assert review_corpus(100, seed=1) != corpus[:100]


def test_corpus_texts_are_distinct_and_short():
    corpus = review_corpus(5000, seed=0)
    assert len(corpus) == 5000
    assert len(set(corpus)) == 5000
    for text in corpus:
        assert 10 <= len(text.split()) <= 40, text
        assert 1 <= sum(text.count(p) for p in ".!?") <= 3, text


def test_polarity_labels_are_balanced():
    labels = [label for _, label in review_records(5000, seed=0)]
    assert set(labels) == {"positive", "negative"}
    assert 0.4 < labels.count("positive") / len(labels) < 0.6


def test_prompt_splits_are_disjoint_even_as_prefixes():
    train, test = review_prompts("train"), review_prompts("test")
    assert len(train) > 1000 and len(test) > 200
    assert len(set(train)) == len(train) and len(set(test)) == len(test)
    assert not set(train) & set(test)
    # stronger: no prompt of one split starts another split's prompt (so no leaked opening)
    train_heads = {" ".join(p.split()[:4]) for p in train}
    assert not any(" ".join(p.split()[:4]) in train_heads for p in test)
    assert all(prompt_split(p) == "train" for p in train)
    assert all(prompt_split(p) == "test" for p in test)


def test_prompts_are_review_openings():
    corpus = review_corpus(5000, seed=0)
    starts = {" ".join(text.split()[:k]).rstrip(",;.") for text in corpus for k in range(4, 8)}
    prompts = review_prompts("train", n=50, seed=3)
    assert len(prompts) == 50
    assert all(4 <= len(p.split()) <= 7 and p in starts for p in prompts)
    assert prompts == review_prompts("train", n=50, seed=3)
    assert prompts != review_prompts("train", n=50, seed=4)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="split"):
        review_prompts("validation")
    with pytest.raises(ValueError, match="only"):
        review_prompts("test", n=10**6)
    with pytest.raises(ValueError, match="n must be"):
        review_corpus(0)
    with pytest.raises(ValueError, match="min_words"):
        review_prompts("train", min_words=5, max_words=3)


def test_datasets_have_the_expected_columns():
    sft = review_sft_dataset(n=20, seed=0)
    assert sft.column_names == ["text", "label"]
    assert sft["text"] == review_corpus(20, seed=0)
    prompts = review_prompt_dataset("test", n=8, seed=0)
    assert prompts.column_names == ["prompt", "query"]
    assert prompts["prompt"] == prompts["query"] == review_prompts("test", n=8, seed=0)
