"""Fixtures for the DDPO tests: the tiny offline Stable Diffusion pipeline and a fast config."""

from __future__ import annotations

import itertools

import pytest

from rlhfkit.testing.diffusion import tiny_sd_pipeline_path


@pytest.fixture(scope="session")
def sd_path():
    return tiny_sd_pipeline_path()


@pytest.fixture
def make_pipeline(sd_path):
    from rlhfkit.models.sd_pipeline import DefaultDDPOStableDiffusionPipeline

    def make(**kwargs):
        return DefaultDDPOStableDiffusionPipeline(sd_path, **kwargs)

    return make


@pytest.fixture
def fast_config(tmp_path):
    """A DDPOConfig that runs an epoch in about a second on one CPU thread."""
    from rlhfkit.trainers.ddpo.config import DDPOConfig

    def make(**overrides):
        values = dict(
            num_epochs=1,
            sample_num_steps=3,
            sample_batch_size=2,
            sample_num_batches_per_epoch=2,
            train_batch_size=2,
            mixed_precision="no",
            logdir=str(tmp_path / "logs"),
            save_freq=1000,
            train_learning_rate=1e-2,
        )
        values.update(overrides)
        return DDPOConfig(**values)

    return make


@pytest.fixture
def prompt_fn():
    """Alternates "a cat" / "a dog", so both prompts appear in every batch of two."""
    it = itertools.cycle(["a cat", "a dog"])
    return lambda: (next(it), {"source": "test"})


@pytest.fixture
def brightness_reward():
    def reward(images, prompts, metadata):
        return images.mean(dim=(1, 2, 3)), {"kind": "brightness"}

    return reward
