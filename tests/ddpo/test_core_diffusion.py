"""rlhfkit.core.diffusion: the DDIM step's log-probability, per-prompt reward normalisation; DDPO's
clipped loss."""

from __future__ import annotations

import math

import pytest
import torch
from diffusers import DDIMScheduler

from rlhfkit.core.diffusion import PerPromptStatTracker, classifier_free_guidance, ddim_step_with_logprob
from rlhfkit.core.losses import ppo_policy_loss
from rlhfkit.core.rewards import clip_tensor


def _scheduler(steps=10, **kwargs):
    config = dict(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    config.update(kwargs)
    scheduler = DDIMScheduler(**config)
    scheduler.set_timesteps(steps)
    return scheduler


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction", "sample"])
@pytest.mark.parametrize("eta", [1.0, 0.5])
def test_ddim_step_matches_diffusers_and_normal_log_density(prediction_type, eta):
    scheduler = _scheduler(prediction_type=prediction_type)
    g = torch.Generator().manual_seed(0)
    sample, model_output = torch.randn(3, 4, 5, 5, generator=g), torch.randn(3, 4, 5, 5, generator=g)
    for t in scheduler.timesteps[[0, 4, -1]]:
        out = ddim_step_with_logprob(
            scheduler, model_output, t, sample, eta=eta, generator=torch.Generator().manual_seed(1)
        )
        noise = torch.randn(sample.shape, generator=torch.Generator().manual_seed(1))
        # diffusers' own DDIM step with the same noise lands on the same latent ...
        reference = scheduler.step(model_output, t, sample, eta=eta, variance_noise=noise).prev_sample
        torch.testing.assert_close(out.prev_sample, reference, rtol=1e-5, atol=1e-5)
        # ... its mean is the noise-free step and its std is eta * sqrt(variance) (DDIM eq. 16)
        mean = scheduler.step(
            model_output, t, sample, eta=eta, variance_noise=torch.zeros_like(sample)
        ).prev_sample
        prev_t = t - scheduler.config.num_train_timesteps // scheduler.num_inference_steps
        std = eta * scheduler._get_variance(t, prev_t).sqrt()
        expected = torch.distributions.Normal(mean, std).log_prob(out.prev_sample).mean(dim=(1, 2, 3))
        assert out.logprobs.shape == (3,)
        torch.testing.assert_close(out.logprobs, expected, rtol=1e-4, atol=1e-3)


def test_scoring_a_given_latent_and_per_sample_timesteps_agree_with_a_loop():
    scheduler = _scheduler()
    sample, model_output, prev = torch.randn(4, 4, 3, 3), torch.randn(4, 4, 3, 3), torch.randn(4, 4, 3, 3)
    timesteps = scheduler.timesteps[torch.tensor([0, 3, 7, 9])]
    batched = ddim_step_with_logprob(scheduler, model_output, timesteps, sample, prev_sample=prev)
    assert torch.equal(batched.prev_sample, prev)  # nothing is sampled when prev_sample is given
    for i, t in enumerate(timesteps):
        single = ddim_step_with_logprob(
            scheduler, model_output[i : i + 1], int(t), sample[i : i + 1], prev_sample=prev[i : i + 1]
        )
        torch.testing.assert_close(batched.logprobs[i : i + 1], single.logprobs)


def test_log_density_at_the_mean_is_the_gaussian_normaliser():
    scheduler = _scheduler()
    sample, model_output = torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3)
    t = scheduler.timesteps[2]
    mean = ddim_step_with_logprob(scheduler, model_output, t, sample).mean
    out = ddim_step_with_logprob(scheduler, model_output, t, sample, prev_sample=mean)
    # at x = mean the squared term vanishes; each of the 36 elements contributes -log std - log(2 pi) / 2,
    # and the per-element mean of 36 equal terms is that term itself
    std = out.std.flatten()[0]
    expected = -std.log() - 0.5 * math.log(2 * math.pi)
    torch.testing.assert_close(out.logprobs, expected.expand(2), rtol=1e-5, atol=1e-4)
    # the log-probability is differentiable in the model output (what training needs)
    model_output.requires_grad_(True)
    ddim_step_with_logprob(
        scheduler, model_output, t, sample, prev_sample=mean.detach() + 0.1
    ).logprobs.sum().backward()
    assert model_output.grad is not None and model_output.grad.abs().sum() > 0


def test_deterministic_steps_are_refused():
    sample = torch.randn(1, 4, 2, 2)
    with pytest.raises(ValueError, match="eta must be > 0"):
        ddim_step_with_logprob(_scheduler(), sample, 500, sample, eta=0.0)
    scheduler = _scheduler(set_alpha_to_one=True)
    with pytest.raises(ValueError, match="set_alpha_to_one"):
        ddim_step_with_logprob(scheduler, sample, scheduler.timesteps[-1], sample)
    unset = DDIMScheduler()
    with pytest.raises(ValueError, match="set_timesteps"):
        ddim_step_with_logprob(unset, sample, 500, sample)


def test_ddpo_surrogate_by_hand():
    # DDPO's loss is PPO's surrogate on one denoising step, sequence-level (mask=None), advantages clamped
    logprobs = torch.tensor([0.0, math.log(1.5), math.log(0.5), math.log(1.5)])
    old = torch.zeros(4)
    advantages = clip_tensor(torch.tensor([2.0, -10.0, 1.0, 1.0]), 5.0)
    out = ppo_policy_loss(logprobs, old, advantages, None, cliprange=0.2)
    # sample 0: ratio 1, A=2 -> max(-2, -2) = -2
    # sample 1: ratio 1.5, A clipped to -5 -> max(5 * 1.5, 5 * 1.2) = 7.5 (the unclipped term)
    # sample 2: ratio 0.5, A=1 -> max(-0.5, -0.8) = -0.5 (the unclipped term)
    # sample 3: ratio 1.5, A=1 -> max(-1.5, -1.2) = -1.2 (the clipped term)
    assert out.loss.item() == pytest.approx((-2 + 7.5 - 0.5 - 1.2) / 4)
    # clipfrac counts where the clipped term set the loss: sample 3 only (three ratios left [0.8, 1.2])
    assert out.clipfrac.item() == pytest.approx(1 / 4)
    assert out.approxkl.item() == pytest.approx(0.5 * (2 * math.log(1.5) ** 2 + math.log(0.5) ** 2) / 4)
    # on-policy (ratio 1) the loss is minus the mean clipped advantage, and its gradient is -A / B
    advantages = advantages[:3]
    lp = torch.zeros(3, requires_grad=True)
    loss = ppo_policy_loss(lp, torch.zeros(3), advantages, None, 0.2).loss
    loss.backward()
    assert loss.item() == pytest.approx(-(2 - 5 + 1) / 3)
    torch.testing.assert_close(lp.grad, -torch.tensor([2.0, -5.0, 1.0]) / 3)


def test_classifier_free_guidance_by_hand():
    noise = torch.tensor([[1.0], [2.0], [3.0], [2.0]])  # [uncond; cond] for a batch of two
    # uncond + g * (cond - uncond) with g = 2: 1 + 2 * 2 = 5 and 2 + 2 * 0 = 2
    torch.testing.assert_close(classifier_free_guidance(noise, 2.0), torch.tensor([[5.0], [2.0]]))


def test_per_prompt_stat_tracker_by_hand():
    tracker = PerPromptStatTracker(buffer_size=3, min_count=2, eps=0.0)
    adv = tracker.update(["a", "a", "b"], torch.tensor([1.0, 3.0, 10.0]))
    # "a" has two rewards (>= min_count): mean 2, sample std sqrt(2) -> (-1, 1) / sqrt(2)
    # "b" has one: the batch's mean 14/3 and sample std sqrt(((1-14/3)^2+(3-14/3)^2+(10-14/3)^2)/2)
    batch_std = math.sqrt(((1 - 14 / 3) ** 2 + (3 - 14 / 3) ** 2 + (10 - 14 / 3) ** 2) / 2)
    torch.testing.assert_close(adv, torch.tensor([-(0.5**0.5), 0.5**0.5, (10 - 14 / 3) / batch_std]))
    # the buffer keeps the last 3 rewards of "a": [3, 5, 7] -> mean 5, sample std sqrt(8/2) = 2
    adv = tracker.update(["a", "a"], torch.tensor([5.0, 7.0]))
    torch.testing.assert_close(adv, (torch.tensor([5.0, 7.0]) - 5) / 2)
    assert tracker.get_stats()["a"]["count"] == 3
    clone = PerPromptStatTracker(3, 2)
    clone.load_state_dict(tracker.state_dict())
    assert clone.get_stats() == tracker.get_stats()
    with pytest.raises(ValueError, match="2 prompts but 3 scores"):
        tracker.update(["a", "b"], torch.ones(3))
