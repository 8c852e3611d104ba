"""fp16 loss scaling: overflowing gradients are GradScaler's to handle, not bad steps for the guards.

Under fp16 the scaler starts at a huge scale on purpose, skips each update whose scaled gradients overflow,
and lowers the scale. The non-finite guards must leave those gradients to it: counting the overflows as bad
steps would stop a healthy run, and zeroing them would hide them from the scaler. accelerate only builds a
GradScaler on a GPU, so these tests give the CPU trainers a real `torch.amp.GradScaler("cpu")` the way
accelerate wires one in: on the accelerator (for `backward` and `clip_grad_norm_`) and on the optimizer.
A scale of 2**127 makes the first update overflow; the back-off factor brings the scale to a usable value
at once, so the next updates go through.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from accelerate.optimizer import AcceleratedOptimizer
from workers.hf_fixtures import build, flat_params

from rlhfkit import PPOConfig, PPOTrainer
from rlhfkit.testing import tiny_tokenizer, tiny_value_head_model
from rlhfkit.trainers.common.guards import NonFiniteStepWarning, loss_scaler_active

HUGE = 2.0**127


def overflowing_scaler() -> torch.amp.GradScaler:
    return torch.amp.GradScaler("cpu", init_scale=HUGE, backoff_factor=2.0**-100, growth_interval=10**6)


def install_scaler(accelerator, optimizer: AcceleratedOptimizer, scaler) -> AcceleratedOptimizer:
    """What `Accelerator(mixed_precision="fp16")` sets up on a GPU: the returned optimizer replaces
    `optimizer`."""
    accelerator.scaler = scaler
    return AcceleratedOptimizer(optimizer.optimizer, device_placement=False, scaler=scaler)


def test_loss_scaler_active_reads_the_accelerator():
    class Acc:
        scaler = None

    assert not loss_scaler_active(Acc())
    Acc.scaler = overflowing_scaler()
    assert loss_scaler_active(Acc())
    assert not loss_scaler_active(object())


def test_ppo_leaves_overflows_to_the_scaler():
    tokenizer = tiny_tokenizer()
    model = tiny_value_head_model("llama", summary_dropout_prob=0.0)
    config = PPOConfig(
        batch_size=4,
        mini_batch_size=2,
        ppo_epochs=2,
        learning_rate=1e-3,
        seed=0,
        max_consecutive_nonfinite_steps=1,
    )
    trainer = PPOTrainer(config, copy.deepcopy(model), tokenizer=tokenizer)
    scaler = overflowing_scaler()
    trainer.optimizer = install_scaler(trainer.accelerator, trainer.optimizer, scaler)
    g = torch.Generator().manual_seed(0)
    queries = [torch.randint(10, 900, (3 + i % 3,), generator=g) for i in range(4)]
    responses = [torch.randint(10, 900, (2 + (i * 2) % 5,), generator=g) for i in range(4)]
    before = flat_params(trainer.policy)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteStepWarning)  # an overflow is not a bad step
        stats = trainer.step(queries, responses, [torch.tensor(float(i) - 1.5) for i in range(4)])
    assert scaler.get_scale() < HUGE  # the first update overflowed and the scaler backed off
    assert stats["ppo/skipped_nonfinite_steps"] == 0
    after = flat_params(trainer.policy)
    assert torch.isfinite(after).all() and not torch.equal(after, before)  # the later updates went through


def test_trainer_based_trainers_leave_overflows_to_the_scaler(tmp_path):
    from transformers import TrainerCallback

    trainer = build("sft", str(tmp_path), per_device=2, max_steps=3)
    trainer.nonfinite_guard.max_consecutive = 1
    scaler = overflowing_scaler()

    class _Fp16(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):  # after Trainer prepared its optimizer
            trainer.optimizer = install_scaler(trainer.accelerator, trainer.optimizer, scaler)

    trainer.add_callback(_Fp16())
    before = flat_params(trainer.model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteStepWarning)
        trainer.train()
    assert trainer.state.global_step == 3 and scaler.get_scale() < HUGE
    after = flat_params(trainer.model)
    assert torch.isfinite(after).all() and not torch.equal(after, before)


@pytest.mark.slow
def test_ddpo_leaves_overflows_to_the_scaler(tmp_path):
    from rlhfkit.models.sd_pipeline import DefaultDDPOStableDiffusionPipeline
    from rlhfkit.testing.diffusion import tiny_sd_pipeline_path
    from rlhfkit.trainers.ddpo.config import DDPOConfig
    from rlhfkit.trainers.ddpo.trainer import DDPOTrainer

    config = DDPOConfig(
        num_epochs=2,
        sample_num_steps=3,
        sample_batch_size=2,
        sample_num_batches_per_epoch=1,
        train_batch_size=2,
        mixed_precision="no",
        logdir=str(tmp_path),
        save_freq=1000,
        train_learning_rate=1e-2,
        max_consecutive_nonfinite_steps=1,
    )
    torch.manual_seed(0)
    pipe = DefaultDDPOStableDiffusionPipeline(str(tiny_sd_pipeline_path()))
    trainer = DDPOTrainer(
        config, lambda images, prompts, meta: images.mean(dim=(1, 2, 3)), lambda: ("a cat", {}), pipe
    )
    scaler = overflowing_scaler()
    trainer.optimizer = install_scaler(trainer.accelerator, trainer.optimizer, scaler)
    # DDPO's LoRA gradients are too small to overflow even at this scale: overflow one gradient for as
    # long as the scaler has not backed off (the first epoch's update), as a real fp16 overflow would
    first = trainer.trainable_params[0]
    first.register_hook(lambda grad: grad * float("inf") if scaler.get_scale() == HUGE else grad)
    before = torch.cat([p.detach().reshape(-1).clone() for p in trainer.trainable_params])
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteStepWarning)
        trainer.train()
    after = torch.cat([p.detach().reshape(-1) for p in trainer.trainable_params])
    assert scaler.get_scale() < HUGE
    assert torch.isfinite(after).all() and not torch.equal(after, before)
