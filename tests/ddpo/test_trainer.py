"""DDPOConfig validation and DDPOTrainer: loss pieces, updates, rewards, hooks, checkpoints, resume."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.trainers.common.checkpointing import load_state
from rlhfkit.trainers.ddpo.config import DDPOConfig
from rlhfkit.trainers.ddpo.trainer import DDPOTrainer


# --- config ---------------------------------------------------------------------------------------
def test_config_defaults_follow_the_documented_api():
    with pytest.warns(UserWarning) if not torch.cuda.is_available() else _nothing():
        config = DDPOConfig()
    assert (
        config.num_epochs,
        config.sample_num_steps,
        config.sample_batch_size,
        config.train_batch_size,
    ) == (100, 50, 1, 1)
    assert (config.train_learning_rate, config.train_clip_range, config.train_adv_clip_max) == (3e-4, 1e-4, 5)
    assert (
        config.tracker_project_name == "trl"
        and config.train_use_lora is True
        and config.negative_prompts == ""
    )
    assert config.per_prompt_stat_tracking_buffer_size == 16 and config.max_workers == 2


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fallback")
def test_fp16_without_a_gpu_falls_back_with_a_warning():
    with pytest.warns(UserWarning, match="fp16.*needs a CUDA GPU"):
        config = DDPOConfig(mixed_precision="fp16")
    assert config.mixed_precision == "no"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            dict(sample_batch_size=3, sample_num_batches_per_epoch=1, train_batch_size=2),
            "3 is not divisible by 2",
        ),
        (
            dict(sample_batch_size=2, train_batch_size=2, train_gradient_accumulation_steps=3),
            "not divisible by 6",
        ),
        (dict(sample_eta=0.0), "sample_eta must be > 0"),
        (dict(train_timestep_fraction=1.5), "train_timestep_fraction"),
        (dict(sample_num_steps=4, train_timestep_fraction=0.1), "leaves no timestep"),
        (dict(mixed_precision="fp8"), "mixed_precision must be one of"),
        (dict(train_batch_size=0), "train_batch_size must be a positive integer"),
    ],
)
def test_bad_config_is_explained(overrides, message):
    with pytest.raises(ValueError, match=message):
        DDPOConfig(**{"mixed_precision": "no", **overrides})


# --- trainer --------------------------------------------------------------------------------------
def test_constructor_rejects_wrong_argument_types(fast_config, make_pipeline, brightness_reward, prompt_fn):
    pipe = make_pipeline()
    with pytest.raises(TypeError, match="reward_function must be callable"):
        DDPOTrainer(fast_config(), None, prompt_fn, pipe)
    with pytest.raises(TypeError, match="sd_pipeline must be a DDPOStableDiffusionPipeline"):
        DDPOTrainer(fast_config(), brightness_reward, prompt_fn, pipe.sd_pipeline)
    with pytest.raises(FileNotFoundError, match="resume_from"):
        DDPOTrainer(fast_config(resume_from="/nonexistent/ckpt"), brightness_reward, prompt_fn, pipe)


def test_first_loss_is_minus_the_mean_clipped_advantage(
    fast_config, make_pipeline, brightness_reward, prompt_fn
):
    trainer = DDPOTrainer(
        fast_config(sample_guidance_scale=2.0), brightness_reward, prompt_fn, make_pipeline()
    )
    samples, _ = trainer._generate_samples(1, 2)
    embeds = torch.cat([samples["negative_prompt_embeds"], samples["prompt_embeds"]])
    advantages = torch.tensor([7.0, -1.0])
    loss, approxkl, clipfrac = trainer.calculate_loss(
        samples["latents"][:, 1],
        samples["timesteps"][:, 1],
        samples["next_latents"][:, 1],
        samples["logprobs"][:, 1],
        advantages,
        embeds,
    )
    # unchanged weights: ratio 1, so loss = -mean(clamp(A, -5, 5)) = -(5 - 1) / 2 = -2
    assert loss.item() == pytest.approx(-2.0, abs=1e-2)
    assert approxkl.item() < 1e-3 and clipfrac.item() == 0.0
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.trainable_params)


def test_step_moves_trainable_weights_only(fast_config, make_pipeline, brightness_reward, prompt_fn):
    pipe = make_pipeline()
    trainer = DDPOTrainer(fast_config(), brightness_reward, prompt_fn, pipe)
    trained = {n: p.detach().clone() for n, p in pipe.unet.named_parameters() if p.requires_grad}
    frozen = {n: p.detach().clone() for n, p in pipe.unet.named_parameters() if not p.requires_grad}
    vae = [p.detach().clone() for p in pipe.vae.parameters()]
    global_step = trainer.step(0, 0)
    assert global_step == 2  # 4 samples / (batch 2 x accumulation 1) optimiser steps
    params = dict(pipe.unet.named_parameters())
    assert all(not torch.equal(params[n], v) for n, v in trained.items())
    assert all(torch.equal(params[n], v) for n, v in frozen.items())
    assert all(torch.equal(a, b) for a, b in zip(pipe.vae.parameters(), vae))
    losses = [h["loss"] for h in trainer.log_history if "loss" in h]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))


@pytest.mark.parametrize(
    ("reward", "error", "message"),
    [
        (lambda images, prompts, meta: None, TypeError, "returned None"),
        (lambda images, prompts, meta: torch.zeros(len(prompts) + 1), ValueError, "must return 2 scores"),
        (lambda images, prompts, meta: ["a"] * len(prompts), TypeError, "numbers"),
    ],
)
def test_malformed_reward_output_is_explained(fast_config, make_pipeline, prompt_fn, reward, error, message):
    trainer = DDPOTrainer(fast_config(), reward, prompt_fn, make_pipeline())
    with pytest.raises(error, match=message):
        trainer.step(0, 0)


def test_malformed_prompt_function_is_explained(fast_config, make_pipeline, brightness_reward):
    trainer = DDPOTrainer(fast_config(), brightness_reward, lambda: "just a prompt", make_pipeline())
    with pytest.raises(TypeError, match=r"\(prompt: str, metadata\) pair"):
        trainer.step(0, 0)


def test_async_rewards_hook_and_per_prompt_tracking(fast_config, make_pipeline, prompt_fn):
    seen_threads, calls = set(), []

    def reward(images, prompts, metadata):
        import threading

        seen_threads.add(threading.current_thread().name)
        return [float(i) for i in range(len(prompts))]  # a plain list is accepted too

    def hook(prompt_image_data, global_step, tracker):
        calls.append((prompt_image_data, global_step, tracker))

    config = fast_config(
        async_reward_computation=True,
        per_prompt_stat_tracking=True,
        per_prompt_stat_tracking_min_count=2,
        num_epochs=2,
    )
    trainer = DDPOTrainer(config, reward, prompt_fn, make_pipeline(), image_samples_hook=hook)
    trainer.train()
    assert all(name != "MainThread" for name in seen_threads) and seen_threads
    # once per epoch, with both sampling batches; no tracker is configured
    assert [(len(data), step, tracker) for data, step, tracker in calls] == [(2, 0, None), (2, 2, None)]
    images, prompts, metadata, rewards, _ = calls[0][0][0]
    assert images.shape == (2, 3, 32, 32) and prompts == ["a cat", "a dog"] and len(metadata) == 2
    assert rewards.tolist() == [0.0, 1.0]
    stats = trainer.stat_tracker.get_stats()
    assert set(stats) == {"a cat", "a dog"} and stats["a cat"]["count"] == 4


def test_checkpoints_are_limited_and_resume_continues_the_run(
    fast_config, make_pipeline, brightness_reward, prompt_fn, tmp_path
):
    from itertools import cycle

    def fresh_prompts():
        it = cycle(["a cat", "a dog"])
        return lambda: (next(it), {})

    def seeded_pipeline():  # same LoRA initialisation for both runs
        torch.manual_seed(0)
        return make_pipeline()

    # uninterrupted: 3 epochs
    full = DDPOTrainer(
        fast_config(num_epochs=3, save_freq=1, num_checkpoint_limit=2, logdir=str(tmp_path / "a")),
        brightness_reward,
        fresh_prompts(),
        seeded_pipeline(),
    )
    full.train()
    names = sorted(p.name for p in full.checkpoint_dir.glob("checkpoint*"))
    assert names == ["checkpoint-2", "checkpoint-3"]  # checkpoint-1 pruned by the limit
    state = load_state(full.checkpoint_dir / "checkpoint-2", "trainer_state")
    assert (state["epoch"], state["global_step"]) == (1, 4)

    # interrupted after 2 epochs, then resumed from the checkpoints folder (picks the latest)
    first = DDPOTrainer(
        fast_config(num_epochs=2, save_freq=1, logdir=str(tmp_path / "b")),
        brightness_reward,
        fresh_prompts(),
        seeded_pipeline(),
    )
    first.train()
    # the interrupted run drew 8 prompts, an even number: a fresh alternating cycle is where it left off
    resumed = DDPOTrainer(
        fast_config(
            num_epochs=3, save_freq=1, logdir=str(tmp_path / "b"), resume_from=str(first.checkpoint_dir)
        ),
        brightness_reward,
        fresh_prompts(),
        seeded_pipeline(),
    )
    assert (resumed.first_epoch, resumed.global_step) == (2, 4)
    resumed.train()
    assert resumed.global_step == full.global_step == 6
    full_rewards = [h["reward_mean"] for h in full.log_history if "reward_mean" in h]
    resumed_rewards = [h["reward_mean"] for h in resumed.log_history if "reward_mean" in h]
    assert resumed_rewards == full_rewards[2:]
    for a, b in zip(resumed.trainable_params, full.trainable_params):
        assert torch.equal(a, b)


def test_a_dataloader_left_open_by_an_earlier_trainer_does_not_make_every_step_sync(
    fast_config, make_pipeline, brightness_reward, prompt_fn
):
    # what an HF Trainer stopping on max_steps leaves behind: a prepared dataloader abandoned mid-iteration
    from accelerate import Accelerator

    other = Accelerator()
    loader = other.prepare(torch.utils.data.DataLoader(list(range(4)), batch_size=1))
    for _ in zip(range(4), loader):  # reaches the last batch, then the loop stops without closing it
        pass
    assert other.gradient_state.in_dataloader and other.gradient_state.end_of_dataloader

    config = fast_config(sample_num_steps=3, train_gradient_accumulation_steps=1)
    trainer = DDPOTrainer(config, brightness_reward, prompt_fn, make_pipeline(use_lora=True))
    state = trainer.accelerator.gradient_state
    assert not state.in_dataloader
    # one optimizer step per accumulation window of 3 timesteps, not one per timestep
    syncs = []
    for _ in range(3):
        with trainer.accelerator.accumulate(trainer.unet):
            syncs.append(trainer.accelerator.sync_gradients)
    assert syncs == [False, False, True]
