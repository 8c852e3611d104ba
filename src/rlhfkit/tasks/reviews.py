"""A synthetic movie-review corpus for the "positive review" task (no download).

In the spirit of the classic GPT-2 sentiment example: a policy continues the first few words of a
review and is rewarded by a sentiment judge. Reviews are generated from the templates and word lists
in `rlhfkit.tasks.lexicon`, half positive and half negative, some with a contrasting remark.
Everything is a pure function of `seed`; the first `n` reviews do not depend on the requested total.
"""

from __future__ import annotations

import random
import zlib
from typing import TYPE_CHECKING

from rlhfkit.tasks import lexicon as lx
from rlhfkit.tasks.sampling import seeded_sample

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

SPLITS = ("train", "test")
# Prompts are split by a hash of their first words, so no prompt of one split is a prefix of (or equal
# to) a prompt of the other. About 1 in TEST_FRACTION_DEN prefixes goes to the test split.
TEST_FRACTION_DEN = 5
PROMPT_POOL_SIZE = 5000
MIN_WORDS, MAX_WORDS = 10, 40


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _adj(rng: random.Random, polarity: str) -> str:
    intensifier = rng.choice(lx.INTENSIFIERS)
    adjective = rng.choice(lx.ADJECTIVES[polarity])
    return f"{intensifier} {adjective}".strip()


def _subject(rng: random.Random) -> str:
    return f"{rng.choice(lx.DETERMINERS)} {rng.choice(lx.GENRES)} {rng.choice(lx.FILM_NOUNS)}"


def _one_review(rng: random.Random) -> tuple[str, str]:
    """Draw one review; returns (text, polarity) with polarity "positive" or "negative"."""
    polarity = rng.choice(("positive", "negative"))
    other = "negative" if polarity == "positive" else "positive"
    subject, when = _subject(rng), rng.choice(lx.WHEN)
    # neutral adjectives occasionally stand in, so not every sentence is loaded
    adj = _adj(rng, "neutral" if rng.random() < 0.1 else polarity)
    slots = {
        "subject": subject,
        "Subject": _cap(subject),
        "when": when,
        "When": _cap(when),
        "company": rng.choice(lx.COMPANY),
        "runtime": rng.choice(lx.RUNTIMES),
        "adj": adj,
        "verdict": rng.choice(lx.VERDICTS[polarity]),
    }
    sentences = [rng.choice(lx.OPENING_TEMPLATES).format(**slots)]
    for _ in range(rng.choice((0, 1, 1, 2))):
        aspect, aspect2 = rng.sample(lx.ASPECTS, 2)
        follow = {
            "aspect": aspect,
            "Aspect": _cap(aspect),
            "aspect2": aspect2,
            "role": rng.choice(lx.ROLES),
            "verb": rng.choice(lx.VERBS[polarity]),
            "adj": _adj(rng, polarity),
            "adj2": _adj(rng, polarity),
            "recommend": rng.choice(lx.RECOMMEND[polarity]),
            "audience": rng.choice(lx.AUDIENCES),
            "noun": rng.choice(lx.FILM_NOUNS),
            "verdict": rng.choice(lx.VERDICTS[polarity]),
        }
        sentences.append(rng.choice(lx.FOLLOW_TEMPLATES).format(**follow))
    if len(sentences) < 3 and rng.random() < 0.1:
        sentences.append(lx.CONTRAST_TEMPLATE.format(aspect=rng.choice(lx.ASPECTS), adj=_adj(rng, other)))
    return " ".join(sentences), polarity


def _draw_review(rng: random.Random) -> tuple[str, str]:
    """Draw reviews until one has MIN_WORDS..MAX_WORDS words."""
    while True:
        text, polarity = _one_review(rng)
        if MIN_WORDS <= len(text.split()) <= MAX_WORDS:
            return text, polarity


def review_records(n: int = 5000, seed: int = 0) -> list[tuple[str, str]]:
    """`n` distinct (text, polarity) pairs; the first k of them are the same for every n >= k."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    rng = random.Random(seed)
    seen: set[str] = set()
    records: list[tuple[str, str]] = []
    max_draws = 20 * n + 1000  # the template space is far larger than any sensible n
    for _ in range(max_draws):
        text, polarity = _draw_review(rng)
        if text not in seen:
            seen.add(text)
            records.append((text, polarity))
            if len(records) == n:
                return records
    raise ValueError(f"could only generate {len(records)} distinct reviews; ask for fewer (n={n})")


def review_corpus(n: int = 5000, seed: int = 0) -> list[str]:
    """`n` distinct synthetic movie reviews of mixed sentiment, 1-3 sentences each."""
    return [text for text, _ in review_records(n, seed)]


def prompt_split(prompt: str, min_words: int = 4) -> str:
    """The split ("train" or "test") a prompt belongs to, decided by its first `min_words` words."""
    # trailing punctuation is ignored so "the spy film," and "the spy film" fall on the same side
    key = " ".join(word.strip(",;.") for word in prompt.split()[:min_words])
    return "test" if zlib.crc32(key.encode("utf-8")) % TEST_FRACTION_DEN == 0 else "train"


def _review_openings(split: str, min_words: int, max_words: int) -> dict[str, str]:
    """Opening of `min_words`..`max_words` words -> the rest of the first review it was cut from."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not 1 <= min_words <= max_words:
        raise ValueError(
            f"need 1 <= min_words <= max_words, got min_words={min_words}, max_words={max_words}"
        )
    cut_rng = random.Random(f"review-prompts-{min_words}-{max_words}")
    openings: dict[str, str] = {}
    for text in review_corpus(PROMPT_POOL_SIZE, seed=0):
        words = text.split()
        k = cut_rng.randint(min_words, max_words)
        prompt = " ".join(words[:k]).rstrip(",;.")
        if len(prompt.split()) >= min_words and prompt_split(prompt, min_words) == split:
            openings.setdefault(prompt, text[len(prompt) :])
    return openings


def review_prompts(
    split: str = "train", n: int | None = None, seed: int = 0, min_words: int = 4, max_words: int = 7
) -> list[str]:
    """Distinct review openings of `min_words`..`max_words` words for one split.

    Prompts are cut from a fixed pool of reviews (seed 0), so both splits come from the same pool and
    are disjoint (see `prompt_split`). `seed` shuffles the prompts; `n=None` returns all of them.
    """
    return seeded_sample(sorted(_review_openings(split, min_words, max_words)), split, n, seed)


def review_references(
    split: str = "test", n: int | None = None, seed: int = 0, min_words: int = 4, max_words: int = 7
) -> list[tuple[str, str]]:
    """`review_prompts` with the rest of the review each was cut from: (prompt, reference completion) pairs,
    the offline default reference of `rlhfkit judge`."""
    openings = _review_openings(split, min_words, max_words)
    return [(prompt, openings[prompt]) for prompt in seeded_sample(sorted(openings), split, n, seed)]


def review_sft_dataset(n: int = 5000, seed: int = 0) -> Dataset:
    """Reviews as a `datasets.Dataset` with "text" and "label" ("positive"/"negative") columns."""
    from datasets import Dataset

    records = review_records(n, seed)
    return Dataset.from_dict({"text": [t for t, _ in records], "label": [p for _, p in records]})


def review_prompt_dataset(split: str = "train", n: int | None = None, seed: int = 0) -> Dataset:
    """Review openings as a `datasets.Dataset` with a "prompt" column and its "query" alias."""
    from datasets import Dataset

    prompts = review_prompts(split, n=n, seed=seed)
    return Dataset.from_dict({"prompt": prompts, "query": list(prompts)})
