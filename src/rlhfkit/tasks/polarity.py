"""A learned second judge for the review task: a bag-of-words-and-bigrams logistic regression.

The demo's gold judge (VADER) is a rule/lexicon scorer that also labelled the preference data, so a
policy can win under it by exploiting its rules. This classifier is a different kind of judge: it
never sees VADER's scores, only the polarity the review generator drew (`review_records`), and it
learns which words and word pairs go with it. It trains in seconds on CPU and is a pure function of
its seed. Training reviews whose opening falls in the test split of `review_prompts` are left out, so
it never reads the start of a held-out prompt.

Scores are P(positive) in [0, 1]; as a pairwise judge: `RuleJudge.of_texts(classifier)`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch

from rlhfkit.tasks.reviews import prompt_split, review_records

TOKEN = re.compile(r"[a-z']+|[.,;!?]")
VOCAB_FILE, WEIGHTS_FILE = "polarity_vocab.json", "polarity.safetensors"


def features(text: str) -> list[str]:
    """Lower-cased words and punctuation, and each adjacent pair of them ("not good" is one feature)."""
    words = TOKEN.findall(text.lower())
    return words + [f"{a} {b}" for a, b in zip(words, words[1:])]


class PolarityClassifier:
    """P(positive) of a review from a logistic regression over its unigram and bigram counts.

    Build one with `PolarityClassifier.train(...)`, or `load(folder)` one saved with `save(folder)`.
    Calling it on a list of texts gives one probability per text (features it never saw are ignored).
    """

    def __init__(self, vocab: Sequence[str], weight: torch.Tensor, bias: float):
        if weight.shape != (len(vocab),):
            raise ValueError(f"weight must have one entry per vocabulary feature, got {tuple(weight.shape)}")
        self.vocab = list(vocab)
        self.index = {feature: i for i, feature in enumerate(self.vocab)}
        self.weight, self.bias = weight.detach().float(), float(bias)

    # ------------------------------------------------------------------ scoring
    def _bags(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat feature ids and per-text offsets, the `embedding_bag` input (unknown features dropped)."""
        ids, offsets = [], []
        for text in texts:
            offsets.append(len(ids))
            ids += [self.index[f] for f in features(text) if f in self.index]
        return torch.tensor(ids, dtype=torch.long), torch.tensor(offsets, dtype=torch.long)

    def logits(self, texts: Sequence[str]) -> torch.Tensor:
        if isinstance(texts, str):
            raise TypeError("texts must be a list of strings, got a single str; wrap it in a list")
        ids, offsets = self._bags(texts)
        table = self.weight.unsqueeze(1)
        return torch.nn.functional.embedding_bag(ids, table, offsets, mode="sum").squeeze(1) + self.bias

    def __call__(self, texts: Sequence[str]) -> list[float]:
        return torch.sigmoid(self.logits(texts)).tolist()

    def accuracy(self, records: Sequence[tuple[str, str]]) -> float:
        """Share of (text, polarity) records whose polarity the classifier gets right (P >= 0.5: positive)."""
        probs = self([text for text, _ in records])
        return sum((p >= 0.5) == (label == "positive") for p, (_, label) in zip(probs, records)) / len(
            records
        )

    # ------------------------------------------------------------------ training
    @classmethod
    def train(
        cls,
        records: Sequence[tuple[str, str]],
        min_count: int = 2,
        epochs: int = 60,
        learning_rate: float = 0.5,
        weight_decay: float = 1e-4,
        seed: int = 0,
    ) -> PolarityClassifier:
        """Fit on (text, "positive"/"negative") records: full-batch Adam on the logistic loss, seeded."""
        if not records:
            raise ValueError("records is empty: give at least one (text, polarity) pair")
        bad = sorted({label for _, label in records} - {"positive", "negative"})
        if bad:
            raise ValueError(f"polarity labels must be 'positive' or 'negative', got {bad}")
        counts = Counter(f for text, _ in records for f in set(features(text)))
        vocab = sorted(f for f, n in counts.items() if n >= min_count)
        model = cls(vocab, torch.zeros(len(vocab)), 0.0)
        ids, offsets = model._bags([text for text, _ in records])
        labels = torch.tensor([float(label == "positive") for _, label in records])
        generator = torch.Generator().manual_seed(seed)
        weight = (0.01 * torch.randn(len(vocab), 1, generator=generator)).requires_grad_()
        bias = torch.zeros(1, requires_grad=True)
        optimizer = torch.optim.Adam([weight, bias], lr=learning_rate)
        for _ in range(epochs):
            optimizer.zero_grad()
            logits = torch.nn.functional.embedding_bag(ids, weight, offsets, mode="sum").squeeze(1) + bias
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
            (loss + weight_decay * weight.pow(2).sum()).backward()
            optimizer.step()
        return cls(vocab, weight.detach().squeeze(1), float(bias.detach()))

    # ------------------------------------------------------------------ files
    def save(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / VOCAB_FILE).write_text(
            json.dumps({"vocab": self.vocab, "bias": self.bias}), encoding="utf-8"
        )
        save_file({"weight": self.weight.contiguous()}, str(folder / WEIGHTS_FILE))

    @classmethod
    def load(cls, folder: str | Path) -> PolarityClassifier:
        from safetensors.torch import load_file

        folder = Path(folder)
        if not (folder / VOCAB_FILE).is_file():
            raise FileNotFoundError(f"no polarity classifier in {folder} (missing {VOCAB_FILE})")
        meta = json.loads((folder / VOCAB_FILE).read_text(encoding="utf-8"))
        return cls(meta["vocab"], load_file(str(folder / WEIGHTS_FILE))["weight"], meta["bias"])


def polarity_training_reviews(n: int, seed: int) -> list[tuple[str, str]]:
    """`n` generator reviews (text, polarity) for the classifier, none opening like a test-split prompt."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    # draw extra: about 1 in 5 openings belongs to the test split and is dropped
    records = [r for r in review_records(2 * n + 100, seed=seed) if prompt_split(r[0]) == "train"]
    if len(records) < n:
        raise ValueError(f"only {len(records)} train-split reviews for seed {seed}; ask for fewer (n={n})")
    return records[:n]
