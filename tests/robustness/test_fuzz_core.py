"""Hypothesis fuzzing of the core maths and shared plumbing: any shapes, sizes and values either work
(right shape, finite where the inputs allow) or raise a ValueError/TypeError that says what was wrong.
A RuntimeError/IndexError/ZeroDivisionError from deep inside torch counts as a failure."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhfkit import core
from rlhfkit.trainers.common.config import exact_div

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SCALES = st.sampled_from([1e-6, 1.0, 1e4])


def _tensor(shape, seed, scale=1.0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


def _mask(shape, seed):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed + 1)) > 0.4


def _call(fn, *args, **kwargs):
    """fn(...) or None when it refused with a clear ValueError/TypeError."""
    try:
        return fn(*args, **kwargs)
    except (ValueError, TypeError) as err:
        assert str(err).strip(), f"{fn.__name__} raised {type(err).__name__} without a message"
        return None


shapes2d = st.tuples(st.integers(0, 4), st.integers(0, 5))
seeds = st.integers(0, 2**16)


@FUZZ
@given(shape=shapes2d, mask_shape=shapes2d, seed=seeds, scale=SCALES, unbiased=st.booleans())
def test_masked_statistics(shape, mask_shape, seed, scale, unbiased):
    values, mask = _tensor(shape, seed, scale), _mask(mask_shape, seed)
    mean = _call(core.masked_mean, values, mask)
    if shape != mask_shape:
        assert mean is None  # mismatched shapes are refused, never broadcast silently
        return
    if mask.sum() > 0:
        assert mean.shape == () and torch.isfinite(mean)
    var = _call(core.masked_var, values, mask, unbiased=unbiased)
    if var is not None and mask.sum() > 1:
        assert torch.isfinite(var) and var >= 0
    white = _call(core.masked_whiten, values, mask)
    if white is not None:
        assert white.shape == values.shape


@FUZZ
@given(shape=shapes2d, seed=seeds, stop=st.integers(0, 9), pad=st.integers(0, 9))
def test_stop_token_truncation(shape, seed, stop, pad):
    responses = torch.randint(0, 10, shape, generator=torch.Generator().manual_seed(seed))
    first = _call(core.first_true_indices, responses == stop)
    assert first is not None and first.shape == shape[:1]
    out = _call(core.truncate_at_stop, responses, stop, pad)
    if out is not None:
        truncated, response_mask = out
        assert truncated.shape == response_mask.shape == shape
        assert bool((truncated[~response_mask] == pad).all())
        # the mask is a prefix of each row: once False, it stays False
        assert bool((response_mask.int().diff(dim=1) <= 0).all()) if shape[1] > 1 else True


@FUZZ
@given(shape=st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(1, 7)), seed=seeds, scale=SCALES)
def test_logprobs_and_entropy(shape, seed, scale):
    logits = _tensor(shape, seed, scale)
    index = torch.randint(0, shape[2], shape[:2], generator=torch.Generator().manual_seed(seed))
    logprobs = _call(core.selective_log_softmax, logits, index)
    assert logprobs is not None and logprobs.shape == shape[:2] and bool((logprobs <= 1e-5).all())
    entropy = _call(core.entropy_from_logits, logits)
    assert entropy is not None and entropy.shape == shape[:2] and torch.isfinite(entropy).all()


@FUZZ
@given(
    shape=shapes2d,
    other=shapes2d,
    seed=seeds,
    kind=st.sampled_from(["kl", "abs", "mse", "k3", "full", "bogus"]),
)
def test_kl_penalty(shape, other, seed, kind):
    kl = _call(core.kl_penalty, _tensor(shape, seed), _tensor(other, seed + 1), kind=kind)
    if kind in ("full", "bogus") or shape != other:
        assert kl is None  # "full" needs logits; unknown kinds and mismatched shapes are refused
    else:
        assert kl.shape == shape and torch.isfinite(kl).all()


@FUZZ
@given(
    shape=shapes2d, seed=seeds, gamma=st.floats(-1, 2), lam=st.floats(-1, 2), scale=SCALES, bad=st.booleans()
)
def test_gae(shape, seed, gamma, lam, scale, bad):
    values, rewards = _tensor(shape, seed, scale), _tensor(shape, seed + 2, scale)
    mask = _mask((shape[0] + int(bad), shape[1]), seed)
    out = _call(core.compute_gae, values, rewards, mask, gamma, lam)
    if bad:
        assert out is None
    elif out is not None:
        advantages, returns = out
        assert advantages.shape == returns.shape == shape


@FUZZ
@given(n=st.integers(0, 12), k=st.integers(-1, 5), seed=seeds, scale=SCALES)
def test_rloo_advantages(n, k, seed, scale):
    out = _call(core.rloo_advantages, _tensor((n,), seed, scale), k)
    if k >= 2 and n > 0 and n % k == 0:
        assert out is not None and out.shape == (n,) and torch.isfinite(out).all()
        # a leave-one-out baseline sums to zero over the k completions of each prompt
        sums = out.reshape(n // k, k).sum(1)  # each prompt's k completions sit on consecutive rows
        torch.testing.assert_close(sums, torch.zeros_like(sums), atol=1e-3 * scale, rtol=0)
    elif k < 2 or n % k:
        assert out is None


@FUZZ
@given(shape=shapes2d, seed=seeds, clip=st.floats(-0.5, 2.0), scale=SCALES, use_mask=st.booleans())
def test_ppo_losses(shape, seed, clip, scale, use_mask):
    mask = _mask(shape, seed) if use_mask else None
    lp, old, adv = _tensor(shape, seed), _tensor(shape, seed + 1), _tensor(shape, seed + 2, scale)
    out = _call(core.ppo_policy_loss, lp, old, adv, mask, clip)
    if out is not None and (mask is None or mask.any()) and shape[0] * shape[1] > 0:
        assert out.loss.shape == () and torch.isfinite(out.loss)
    out = _call(core.ppo_value_loss, lp, old, adv, mask, clip)
    if out is not None and (mask is None or mask.any()) and shape[0] * shape[1] > 0:
        assert torch.isfinite(out.loss)


@FUZZ
@given(
    sizes=st.lists(st.integers(0, 4), min_size=4, max_size=4),
    seed=seeds,
    beta=st.floats(-1, 5),
    smoothing=st.floats(-0.2, 0.7),
    loss_type=st.sampled_from(["sigmoid", "hinge", "ipo", "nope"]),
    scale=SCALES,
)
def test_dpo_loss(sizes, seed, beta, smoothing, loss_type, scale):
    logps = [_tensor((n,), seed + i, scale) for i, n in enumerate(sizes)]
    out = _call(core.dpo_loss, *logps, beta=beta, loss_type=loss_type, label_smoothing=smoothing)
    valid = len(set(sizes)) == 1 and beta > 0 and 0 <= smoothing < 0.5 and loss_type != "nope"
    if not valid:
        assert out is None
    else:
        losses, chosen, rejected = out
        assert losses.shape == chosen.shape == rejected.shape == (sizes[0],)
        if beta >= 1e-3:  # IPO's target 1/(2 beta) overflows float32 for absurdly small beta
            assert torch.isfinite(losses).all()


@FUZZ
@given(n=st.integers(0, 5), m=st.integers(0, 5), seed=seeds, scale=SCALES, coef=st.none() | st.floats(0, 1))
def test_pairwise_reward_loss(n, m, seed, scale, coef):
    out = _call(
        core.pairwise_reward_loss,
        _tensor((n,), seed, scale),
        _tensor((m,), seed + 1, scale),
        center_rewards_coefficient=coef,
    )
    if n != m:
        assert out is None
    elif out is not None and n > 0:
        assert out.shape == () and torch.isfinite(out)


@FUZZ
@given(shape=shapes2d, seed=seeds, coef=st.floats(0, 1), bad_scores=st.booleans())
def test_token_rewards(shape, seed, coef, bad_scores):
    b = shape[0] + int(bad_scores)
    out = _call(
        core.compute_token_rewards,
        _tensor((b,), seed),
        _tensor(shape, seed + 1),
        _tensor(shape, seed + 2),
        _mask(shape, seed),
        coef,
    )
    if bad_scores:
        assert out is None
    elif out is not None:
        assert all(t.shape == shape for t in out)


@FUZZ
@given(a=st.integers(-10, 100), b=st.integers(-3, 12))
def test_exact_div(a, b):
    out = _call(exact_div, a, b, "batch")
    if b > 0 and a % b == 0:
        assert out * b == a
    else:
        assert out is None


@pytest.mark.parametrize("bad", [None, "x", [1.0, 2.0]])
def test_core_functions_reject_non_tensors_clearly(bad):
    # a list or None where a tensor belongs: a TypeError/ValueError/AttributeError naming the problem is ok;
    # what must not happen is a silent wrong answer
    for fn, args in (
        (core.masked_mean, (bad, torch.ones(2, dtype=torch.bool))),
        (core.rloo_advantages, (bad, 2)),
        (core.pairwise_reward_loss, (bad, torch.zeros(2))),
    ):
        with pytest.raises((TypeError, ValueError, AttributeError)):
            fn(*args)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    content=st.binary(max_size=64), suffix=st.sampled_from([".json", ".safetensors", ".pt", ".bin", ".txt"])
)
def test_validate_checkpoint_on_random_bytes(tmp_path, content, suffix):
    # any garbage in a checkpoint file is either accepted (plain text, valid JSON) or a ValueError naming it
    from rlhfkit.trainers.common.checkpointing import validate_checkpoint

    folder = tmp_path / "checkpoint-1"
    folder.mkdir(exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    (folder / f"state{suffix}").write_bytes(content)
    try:
        validate_checkpoint(folder)
    except ValueError as err:
        assert f"state{suffix}" in str(err)
