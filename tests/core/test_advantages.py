import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.core import compute_gae, rloo_advantages, whitened_gae


def test_rloo_reward():
    # seed 000 (TRL RLOO docs), verbatim except that the vectorised part calls rloo_advantages: the seed lays
    # completion j of prompt i at row i + j * B, rlhfkit at row i * k + j, so its input is transposed
    local_batch_size = 3
    rloo_k = 4
    # fmt: off
    rlhf_reward = torch.tensor([
        1, 2, 3,  # first rlhf reward for three prompts
        2, 3, 4,  # second rlhf reward for three prompts
        5, 6, 7,  # third rlhf reward for three prompts
        8, 9, 10,  # fourth rlhf reward for three prompts
    ]).float()  # here we have 3 prompts which have 4 completions each
    # fmt: on

    baseline = (rlhf_reward.sum(0) - rlhf_reward) / (rloo_k - 1)  # noqa: F841 (kept from the seed)
    advantages = torch.zeros_like(rlhf_reward)
    for i in range(0, len(advantages), local_batch_size):
        other_response_rlhf_rewards = []
        for j in range(0, len(advantages), local_batch_size):
            if i != j:
                other_response_rlhf_rewards.append(rlhf_reward[j : j + local_batch_size])
        advantages[i : i + local_batch_size] = rlhf_reward[i : i + local_batch_size] - torch.stack(
            other_response_rlhf_rewards
        ).mean(0)
    assert (1 - (2 + 5 + 8) / 3 - advantages[0].item()) < 1e-6  # First rlhf reward for the first prompt
    assert (6 - (3 + 2 + 9) / 3 - advantages[7].item()) < 1e-6  # Third rlhf reward for the second prompt

    # Vectorized implementation
    consecutive = rlhf_reward.reshape(rloo_k, local_batch_size).T.flatten()  # prompt i's k rewards together
    vec_advantages = rloo_advantages(consecutive, rloo_k).reshape(local_batch_size, rloo_k).T
    torch.testing.assert_close(vec_advantages.flatten(), advantages)


def test_rloo_hand_values():
    # prompt 0 has rewards (1, 2, 5, 8) at rows 0-3, prompt 1 (2, 3, 6, 9) at rows 4-7
    r = torch.tensor([1, 2, 5, 8, 2, 3, 6, 9, 3, 4, 7, 10]).float()
    adv = rloo_advantages(r, 4)
    # row 0: 1 - (2 + 5 + 8)/3 = -4 ; row 3: 8 - (1 + 2 + 5)/3 = 16/3
    assert adv[0].item() == pytest.approx(-4.0)
    assert adv[3].item() == pytest.approx(16 / 3)
    # row 6 (prompt 1, third completion): 6 - (2 + 3 + 9)/3 = 4/3
    assert adv[6].item() == pytest.approx(4 / 3)
    # leave-one-out advantages of one prompt sum to zero
    assert adv.reshape(3, 4).sum(1).abs().max().item() < 1e-5


def test_rloo_bad_input():
    with pytest.raises(ValueError, match="divisible"):
        rloo_advantages(torch.zeros(7), 2)
    with pytest.raises(ValueError, match="rloo_k"):
        rloo_advantages(torch.zeros(4), 1)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 5), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_rloo_matches_naive_loop(k, batch, seed):
    r = torch.randn(k * batch, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    adv = rloo_advantages(r, k)
    for idx in range(k * batch):
        prompt = idx // k
        others = [r[prompt * k + j].item() for j in range(k) if prompt * k + j != idx]
        assert adv[idx].item() == pytest.approx(r[idx].item() - sum(others) / len(others), abs=1e-9)


def naive_gae(values, rewards, mask, gamma, lam):
    """Per-row python loop over the real tokens only (masked positions skipped)."""
    advantages = torch.zeros_like(values)
    for b in range(values.size(0)):
        real = [t for t in range(values.size(1)) if mask[b, t]]
        last_gae, next_value = 0.0, 0.0
        for t in reversed(real):
            delta = rewards[b, t].item() + gamma * next_value - values[b, t].item()
            last_gae = delta + gamma * lam * last_gae
            advantages[b, t] = last_gae
            next_value = values[b, t].item()
    return advantages, (advantages + values) * mask


def test_gae_hand_values():
    # one row, 2 real tokens then padding with junk that must not leak
    values = torch.tensor([[1.0, 2.0, 50.0]])
    rewards = torch.tensor([[0.0, 1.0, 50.0]])
    mask = torch.tensor([[True, True, False]])
    adv, ret = compute_gae(values, rewards, mask, gamma=0.5, lam=0.5)
    # t=1: delta = 1 + 0.5*0 - 2 = -1 ; A1 = -1
    # t=0: delta = 0 + 0.5*2 - 1 = 0 ; A0 = 0 + 0.5*0.5*(-1) = -0.25
    torch.testing.assert_close(adv, torch.tensor([[-0.25, -1.0, 0.0]]))
    # returns = A + V: 0.75, 1.0, and 0 on padding
    torch.testing.assert_close(ret, torch.tensor([[0.75, 1.0, 0.0]]))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 8), st.integers(0, 2**31 - 1))
def test_gae_lambda1_gamma1_is_reward_to_go_minus_values(batch, length, seed):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(batch, length, generator=g, dtype=torch.float64)
    rewards = torch.randn(batch, length, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, length + 1, (batch,), generator=g)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    adv, ret = compute_gae(values, rewards, mask, gamma=1.0, lam=1.0)
    reward_to_go = (rewards * mask).flip(-1).cumsum(-1).flip(-1)
    torch.testing.assert_close(adv, ((reward_to_go - values) * mask).float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret, (reward_to_go * mask).float(), rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.booleans())
def test_gae_matches_naive_loop(seed, gamma, lam, holes):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(3, 6, generator=g)
    rewards = torch.randn(3, 6, generator=g)
    if holes:
        mask = torch.rand(3, 6, generator=g) > 0.3
    else:
        mask = torch.arange(6)[None, :] < torch.randint(0, 7, (3, 1), generator=g)
    adv, ret = compute_gae(values, rewards, mask, gamma, lam)
    naive_adv, naive_ret = naive_gae(values, rewards, mask, gamma, lam)
    torch.testing.assert_close(adv, naive_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret, naive_ret, rtol=1e-5, atol=1e-5)


def test_gae_shape_mismatch():
    with pytest.raises(ValueError, match="same"):
        compute_gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool), 1.0, 1.0)


def test_whitened_gae_hand_values():
    # one row, gamma = lam = 1, values 0: advantages are rewards-to-go [3, 2] (rewards [1, 2]); the padded
    # third position stays 0. Whitened over the two real tokens: mean 2.5, unbiased std sqrt(0.5):
    # (3 - 2.5) / 0.7071 = 0.7071 and (2 - 2.5) / 0.7071 = -0.7071. Returns are not whitened.
    values = torch.zeros(1, 3)
    rewards = torch.tensor([[1.0, 2.0, 9.0]])
    mask = torch.tensor([[True, True, False]])
    advantages, returns = whitened_gae(values, rewards, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(advantages, torch.tensor([[0.7071068, -0.7071068, 0.0]]), atol=1e-5, rtol=0)
    torch.testing.assert_close(returns, torch.tensor([[3.0, 2.0, 0.0]]))
    assert not advantages.requires_grad


def test_whitened_gae_with_one_real_token_is_not_whitened():
    values, rewards = torch.zeros(1, 2), torch.tensor([[4.0, 0.0]])
    mask = torch.tensor([[True, False]])
    advantages, _ = whitened_gae(values, rewards, mask, gamma=1.0, lam=1.0)
    assert advantages.tolist() == [[4.0, 0.0]]  # a single value has no variance to divide by
