"""DDPOTrainer keeps a run: SIGTERM finishes the epoch, saves and returns; resuming matches the uninterrupted
run; NaN rewards skip the epoch's update; NaN gradients skip the optimizer step; too many stop the run."""

from __future__ import annotations

import itertools
import os
import signal
import warnings

import pytest
import torch

from rlhfkit.trainers.common.guards import NonFiniteError, NonFiniteStepWarning


def _prompts():
    it = itertools.cycle(["a cat", "a dog"])
    return lambda: (next(it), {})


def _brightness(images, prompts, metadata):
    return images.mean(dim=(1, 2, 3))


def _trainer(logdir, reward=_brightness, **kw):
    from rlhfkit.models.sd_pipeline import DefaultDDPOStableDiffusionPipeline
    from rlhfkit.testing.diffusion import tiny_sd_pipeline_path
    from rlhfkit.trainers.ddpo.config import DDPOConfig
    from rlhfkit.trainers.ddpo.trainer import DDPOTrainer

    cfg = dict(num_epochs=3, sample_num_steps=3, sample_batch_size=2, sample_num_batches_per_epoch=1,
               train_batch_size=2, mixed_precision="no", logdir=str(logdir), save_freq=1000,
               train_learning_rate=1e-2)  # fmt: skip
    cfg.update(kw)
    torch.manual_seed(0)  # the same LoRA initialisation for every run
    pipe = DefaultDDPOStableDiffusionPipeline(str(tiny_sd_pipeline_path()))
    return DDPOTrainer(DDPOConfig(**cfg), reward, _prompts(), pipe)


def _params(trainer):
    return torch.cat([p.detach().reshape(-1).clone() for p in trainer.trainable_params])


@pytest.mark.slow
def test_sigterm_saves_and_resume_matches_uninterrupted(tmp_path):
    full = _trainer(tmp_path / "full")
    full.train()

    calls = {"n": 0}

    def reward_then_signal(images, prompts, metadata):  # the signal arrives during epoch 1 (the second)
        calls["n"] += 1
        if calls["n"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return _brightness(images, prompts, metadata)

    cut = _trainer(tmp_path / "cut", reward=reward_then_signal)
    cut.train()  # returns normally after finishing epoch 1
    assert cut.first_epoch == 2
    assert [p.name for p in cut.checkpoint_dir.glob("checkpoint*")] == ["checkpoint-2"]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    resumed = _trainer(tmp_path / "resumed", resume_from=str(cut.checkpoint_dir))
    resumed.train()
    assert resumed.global_step == full.global_step
    torch.testing.assert_close(_params(resumed), _params(full), rtol=0, atol=0)
    full_rewards = [h["reward_mean"] for h in full.log_history if "reward_mean" in h]
    resumed_rewards = [h["reward_mean"] for h in resumed.log_history if "reward_mean" in h]
    assert resumed_rewards == full_rewards[2:]  # the same numbers, bit for bit


def test_nan_rewards_skip_the_epoch(tmp_path):
    calls = {"n": 0}

    def nan_on_second_epoch(images, prompts, metadata):
        calls["n"] += 1
        scores = _brightness(images, prompts, metadata)
        return scores * float("nan") if calls["n"] == 2 else scores

    trainer = _trainer(tmp_path, reward=nan_on_second_epoch, num_epochs=2)
    trainer.train(epochs=1)
    after_first = _params(trainer)
    with pytest.warns(NonFiniteStepWarning, match="step 2: non-finite scores"):
        trainer.train(epochs=2)
    assert torch.equal(_params(trainer), after_first)
    assert trainer.nonfinite_guard.skipped == 1


def test_nan_gradients_skip_steps_then_stop_with_checkpoint(tmp_path):
    trainer = _trainer(tmp_path, max_consecutive_nonfinite_steps=2)
    start = _params(trainer)
    for p in trainer.trainable_params:
        p.register_hook(lambda g: g * float("nan"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteStepWarning)
        with pytest.raises(NonFiniteError, match="non-finite loss, gradients|non-finite gradients"):
            trainer.train()
    assert torch.equal(_params(trainer), start)
    saved = [p for p in trainer.checkpoint_dir.iterdir() if not p.name.startswith(".")]
    assert len(saved) == 1
    from safetensors.torch import load_file

    weights = load_file(str(saved[0] / "model.safetensors"))
    assert all(torch.isfinite(w).all() for w in weights.values())
