"""Every sampling path draws from the distribution it claims, at a 1k and a 152k vocabulary.

Each test draws N tokens and checks every token's frequency against its exact probability (float64) with
a per-token z-test at Z standard deviations (Z covers the number of tokens, so a correct sampler passes
with a fixed seed by a wide margin). N is chosen so that the test *detects a 1% absolute bias in any
token's frequency*: the largest allowed deviation, Z * sqrt(p (1 - p) / N) <= Z / (2 sqrt(N)), stays below
0.75%, so a 1% bias is at least 8.7 standard deviations out. `torch.multinomial` runs through the same
check and, at the draw counts where that is affordable, against our draws token by token.

Paths: `sample_inverse_cdf` alone (flat, peaked and masked rows); the decode loop's warpers
(`process_logits`: temperature, top-k, top-p, min-p) with the sampler, against transformers' warpers; and
both generation backends end to end (`DecodeLoopBackend`, `HFGenerationBackend`, which samples with
`torch.multinomial` inside `generate`) on a small model.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rlhfkit.rollout import DecodeLoopBackend, HFGenerationBackend, SamplingParams
from rlhfkit.rollout.decoding import DecodeSettings, process_logits, sample_inverse_cdf

Z = 6.5
BIAS = 0.01  # the absolute frequency bias each test must be able to detect
VOCABS = [1000, 151_936]


def largest_allowed_deviation(n: int) -> float:
    return Z * 0.5 / math.sqrt(n)


def bins_of(expected: torch.Tensor, min_count: float = 50.0) -> torch.Tensor:
    """Bin of each token: consecutive tokens pooled until a bin expects `min_count` draws, so the normal
    approximation holds; a token that expects more has a bin of its own or shares one with neighbours."""
    start = expected.cumsum(0) - expected
    bins = (start / min_count).floor().long().clamp(max=max(int(expected.sum() // min_count) - 1, 0))
    return torch.unique(bins, return_inverse=True)[1]  # numbered 0.. with none empty


def assert_follows(draws: torch.Tensor, probs: torch.Tensor) -> None:
    """Every bin's count within Z standard deviations of N p; no zero-probability token drawn."""
    n = draws.numel()
    assert largest_allowed_deviation(n) <= 0.75 * BIAS, f"{n} draws cannot detect a {BIAS:.0%} bias"
    p = probs.double() / probs.double().sum()
    counts = torch.bincount(draws, minlength=p.numel()).double()
    assert counts.numel() == p.numel(), "a token outside the vocabulary was drawn"
    assert counts[p == 0].sum() == 0, "a zero-probability token was drawn"
    counts, p = counts[p > 0], p[p > 0]
    bins = bins_of(n * p)
    observed = torch.zeros(int(bins.max()) + 1, dtype=torch.float64).index_add_(0, bins, counts)
    share = torch.zeros_like(observed).index_add_(0, bins, p)
    z = (observed - n * share).abs() / (n * share * (1 - share)).sqrt()
    worst = int(z.argmax())
    tokens = (bins == worst).nonzero()[:, 0]
    assert z.max() <= Z, (
        f"tokens {tokens[0]}..{tokens[-1]}: {int(observed[worst])} draws, expected {n * share[worst]:.1f}"
    )


def assert_same_distribution(a: torch.Tensor, b: torch.Tensor, vocab: int) -> None:
    """Two equal-size samples agree token by token (difference of counts within Z sd of its null)."""
    n = a.numel()
    assert Z * math.sqrt(2 * 0.25 / n) <= 0.9 * BIAS, f"{n} draws each cannot detect a {BIAS:.0%} bias"
    ca, cb = (torch.bincount(d, minlength=vocab).double() for d in (a, b))
    both = ca + cb
    z = (ca - cb).abs() / both.clamp(min=1).sqrt()
    assert z.max() <= Z, f"token {int(z.argmax())}: {int(ca[z.argmax()])} against {int(cb[z.argmax()])}"


def row(kind: str, vocab: int, seed: int = 0) -> torch.Tensor:
    """(1, vocab) probabilities: flat, peaked (one token about half the mass) or masked (most tokens 0)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, vocab, generator=g)
    if kind == "flat":
        logits = torch.zeros(1, vocab)
    elif kind == "peaked":
        logits = logits * 2
        logits[0, vocab // 3] = logits.max() + math.log(vocab) + 2  # about half of the mass
    elif kind == "masked":
        keep = torch.randperm(vocab, generator=g)[:40]
        logits = torch.full((1, vocab), float("-inf")).index_copy(1, keep, logits[0, keep][None] * 2)
    return logits.softmax(-1)


def draw(probs: torch.Tensor, n: int, seed: int = 0, chunk: int = 1000) -> torch.Tensor:
    """n draws from one row of probabilities, through `sample_inverse_cdf` on n identical rows."""
    torch.manual_seed(seed)
    return torch.cat([sample_inverse_cdf(probs.expand(min(chunk, n - i), -1)) for i in range(0, n, chunk)])


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("kind", ["flat", "peaked", "masked"])
def test_inverse_cdf_follows_the_probabilities(kind, vocab):
    probs = row(kind, vocab)
    assert_follows(draw(probs, 200_000), probs[0])


def test_inverse_cdf_agrees_with_multinomial_token_by_token():
    probs = row("peaked", 1000, seed=1)
    n = 300_000
    ours = draw(probs, n, seed=1)
    torch.manual_seed(2)
    theirs = torch.cat([torch.multinomial(probs.expand(5000, -1), 1)[:, 0] for _ in range(n // 5000)])
    assert_follows(theirs, probs[0])
    assert_same_distribution(ours, theirs, 1000)


@pytest.mark.parametrize("vocab", VOCABS)
def test_multinomial_in_float64_and_inverse_cdf_agree_at_every_vocabulary(vocab):
    probs = row("peaked", vocab, seed=3)
    n = 300_000
    torch.manual_seed(4)
    theirs = torch.multinomial(probs[0].double(), n, replacement=True)  # one row: a float64 running sum
    assert_same_distribution(draw(probs, n, seed=3), theirs, vocab)


def test_a_grid_of_uniform_draws_lands_where_the_exact_inverse_cdf_does(monkeypatch):
    """White box, at 152k: uniform draws on a grid of 200k points against the float64 inverse CDF.

    The block totals are float32 sums, which shift a block's start, and every boundary inside it, by about
    1e-9: 26 of the 200k points move. One float32 running sum over the row (the sampler before the two-level
    search) shifts boundaries by up to 6e-8 and puts 765 of them on another token.
    """
    vocab, n = 151_936, 200_000
    probs = row("flat", vocab) * torch.linspace(0.5, 1.5, vocab)  # unequal, unnormalised
    grid = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    chunks = iter(grid.split(1000))
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: next(chunks)[:, None].to(kw.get("dtype")))
    drawn = torch.cat([sample_inverse_cdf(probs.expand(1000, -1)) for _ in range(n // 1000)])
    exact = torch.searchsorted(probs[0].double().cumsum(0) / probs.double().sum(), grid, right=True)
    assert (drawn != exact).sum() <= 100


WARPERS = {
    "temperature 0.7": (dict(temperature=0.7), [TemperatureLogitsWarper(0.7)]),
    "top-k 50": (dict(top_k=50), [TopKLogitsWarper(50)]),
    "top-p 0.9": (dict(temperature=1.3, top_p=0.9), [TemperatureLogitsWarper(1.3), TopPLogitsWarper(0.9)]),
    "min-p 0.05": (dict(min_p=0.05), [MinPLogitsWarper(0.05)]),
}


def settings_of(**kw) -> DecodeSettings:
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=None)
    return DecodeSettings(
        1, True, repetition_penalty=1.0, min_length=0, min_new_tokens=0, eos_token_ids=(), **{**base, **kw}
    )


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("name", list(WARPERS))
def test_the_decode_loops_warpers_and_sampler_follow_transformers_distribution(name, vocab):
    kw, warpers = WARPERS[name]
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(5)) * 3
    expected = (
        LogitsProcessorList(warpers)(torch.zeros(1, 1, dtype=torch.long), logits.clone()).double().softmax(-1)
    )
    probs = process_logits(logits, settings_of(**kw), None).softmax(-1)  # what the decode loop samples from
    assert_follows(draw(probs, 200_000, seed=6), expected[0])


def small_model(vocab: int = 1000) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32,
        pad_token_id=0, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40)  # logits of a few units: a distribution with a shape
    return model


@pytest.mark.slow
@pytest.mark.parametrize("backend", [DecodeLoopBackend, HFGenerationBackend])
@pytest.mark.parametrize("name", list(WARPERS))
def test_both_backends_sample_the_next_token_from_the_models_distribution(backend, name):
    model, n = small_model(), 200_000
    kw, warpers = WARPERS[name]
    prompt = torch.tensor([[5, 17, 3]])
    with torch.no_grad():
        logits = model(prompt).logits[:, -1].float()
    expected = LogitsProcessorList(warpers)(prompt, logits.clone()).double().softmax(-1)[0]
    params = SamplingParams(1, do_sample=True, **{**dict(temperature=1.0, top_k=0, top_p=1.0), **kw})
    torch.manual_seed(7)
    out = backend(model, 0, chunk_size=5000).generate(
        prompt.expand(n, -1), torch.ones(n, 3, dtype=torch.long), params
    )
    assert out.responses.shape == (n, 1)
    assert_follows(out.responses[:, 0], expected)
