import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.core import (
    RunningMoments,
    apply_missing_eos_penalty,
    batch_moments,
    clip_tensor,
    combine_moments,
    compute_token_rewards,
    scale_scores,
)


def test_token_rewards_hand_values():
    logprobs = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    ref_logprobs = torch.tensor([[-1.5, -0.5, -9.0], [-2.0, -3.0, -2.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    scores = torch.tensor([10.0, 20.0])
    rewards, non_score, kl = compute_token_rewards(scores, logprobs, ref_logprobs, mask, kl_coef=0.1)
    # kl = logp - ref: row 0 (0.5, -0.5, masked->0); row 1 (0, 1, 0)
    torch.testing.assert_close(kl, torch.tensor([[0.5, -0.5, 0.0], [0.0, 1.0, 0.0]]))
    torch.testing.assert_close(non_score, torch.tensor([[-0.05, 0.05, 0.0], [0.0, -0.1, 0.0]]))
    # score at last real token: row 0 t=1 (0.05 + 10), row 1 t=2 (0 + 20)
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 10.05, 0.0], [0.0, -0.1, 20.0]]))


def test_token_rewards_k3_and_empty_row():
    logprobs = torch.tensor([[-1.0, -2.0], [0.0, 0.0]])
    ref = torch.tensor([[-1.0, -1.0], [0.0, 0.0]])
    mask = torch.tensor([[True, True], [False, False]])
    rewards, _, kl = compute_token_rewards(
        torch.tensor([1.0, 5.0]), logprobs, ref, mask, 1.0, kl_penalty="k3"
    )
    # k3 at t=1: x = ref - logp = 1 -> e - 2
    assert kl[0, 1].item() == pytest.approx(math.e - 2, rel=1e-5)
    # the empty row receives neither KL nor score
    assert rewards[1].abs().sum().item() == 0.0


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(0.0, 1.0))
def test_token_rewards_match_naive_loop(seed, kl_coef):
    g = torch.Generator().manual_seed(seed)
    logprobs, ref = -torch.rand(4, 5, generator=g), -torch.rand(4, 5, generator=g)
    mask = torch.arange(5)[None, :] < torch.randint(0, 6, (4, 1), generator=g)
    scores = torch.randn(4, generator=g)
    rewards, _, _ = compute_token_rewards(scores, logprobs, ref, mask, kl_coef)
    for b in range(4):
        real = [t for t in range(5) if mask[b, t]]
        for t in range(5):
            expected = -kl_coef * (logprobs[b, t] - ref[b, t]).item() if t in real else 0.0
            if real and t == real[-1]:
                expected += scores[b].item()
            assert rewards[b, t].item() == pytest.approx(expected, abs=1e-5)


def test_token_rewards_bad_shapes():
    with pytest.raises(ValueError, match="scores"):
        compute_token_rewards(torch.zeros(3), torch.zeros(2, 4), torch.zeros(2, 4), torch.ones(2, 4), 0.1)
    with pytest.raises(ValueError, match="unknown KL kind"):
        compute_token_rewards(
            torch.zeros(2), torch.zeros(2, 4), torch.zeros(2, 4), torch.ones(2, 4), 0.1, "x"
        )


def test_missing_eos_penalty_clip_and_normalize():
    scores = torch.tensor([1.0, 2.0])
    # second sequence has no EOS -> 2 - 1.5
    out = apply_missing_eos_penalty(scores, torch.tensor([True, False]), 1.5)
    torch.testing.assert_close(out, torch.tensor([1.0, 0.5]))
    torch.testing.assert_close(
        clip_tensor(torch.tensor([-20.0, 3.0, 11.0]), 10.0), torch.tensor([-10.0, 3.0, 10.0])
    )


def test_running_moments_hand_values():
    rm = RunningMoments()
    assert (rm.mean, rm.std) == (0.0, 1.0)
    batch_mean, batch_std = rm.update(torch.tensor([1.0, 3.0]))
    # batch: mean 2, sample std sqrt(2)
    assert batch_mean == pytest.approx(2.0) and batch_std == pytest.approx(math.sqrt(2))
    rm.update(torch.tensor([5.0, 7.0]))
    # all of (1, 3, 5, 7): mean 4, population var 5, sample std sqrt(20/3)
    assert rm.mean == pytest.approx(4.0) and rm.var == pytest.approx(5.0) and rm.count == 4
    assert rm.std == pytest.approx(math.sqrt(20 / 3))
    # scaling with those moments: (7 - 4) / sqrt(20/3)
    assert scale_scores(torch.tensor([7.0]), rm).item() == pytest.approx(3 / math.sqrt(20 / 3), rel=1e-5)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.floats(-50, 50), min_size=0, max_size=8), min_size=1, max_size=5))
def test_merge_across_ranks_equals_one_pass(chunks):
    everything = [x for chunk in chunks for x in chunk]
    ranks = []
    for chunk in chunks:
        rm = RunningMoments()
        rm.update(torch.tensor(chunk, dtype=torch.float64))
        ranks.append(rm)
    merged = RunningMoments()
    for rm in ranks:
        merged.update_from_moments(rm.mean, rm.var, rm.count)
    combined = combine_moments([batch_moments(torch.tensor(c, dtype=torch.float64)) for c in chunks])
    assert merged.count == combined[2] == len(everything)
    if everything:
        t = torch.tensor(everything, dtype=torch.float64)
        assert merged.mean == pytest.approx(t.mean().item(), abs=1e-9)
        assert combined[0] == pytest.approx(t.mean().item(), abs=1e-9)
        assert merged.var == pytest.approx(t.var(unbiased=False).item(), abs=1e-7)


def test_running_moments_state_round_trip():
    rm = RunningMoments()
    rm.update(torch.tensor([1.0, 2.0, 4.0]))
    other = RunningMoments()
    other.load_state_dict(rm.state_dict())
    assert other.state_dict() == rm.state_dict()
