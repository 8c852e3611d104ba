"""RLOOTrainer keeps a run: SIGINT saves and stops, resuming continues exactly, NaN scores skip the update."""

from __future__ import annotations

import os
import signal
import warnings

import pytest
import torch
from transformers import TrainerCallback

from rlhfkit.rewards import KeywordReward
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.trainers.common.checkpointing import latest_checkpoint
from rlhfkit.trainers.common.guards import NonFiniteError, NonFiniteStepWarning
from rlhfkit.trainers.rloo.config import RLOOConfig
from rlhfkit.trainers.rloo.trainer import RLOOTrainer


def _trainer(out, reward=None, callbacks=None, **kw):
    cfg = dict(
        output_dir=str(out), report_to="none", use_cpu=True, per_device_train_batch_size=2, rloo_k=2,
        num_ppo_epochs=1, response_length=4, total_episodes=8, logging_steps=1, save_strategy="no",
        num_sample_generations=0, disable_tqdm=True, seed=3, learning_rate=1e-3,
    )  # fmt: skip
    cfg.update(kw)
    return RLOOTrainer(
        RLOOConfig(**cfg),
        tiny_tokenizer(padding_side="left"),
        tiny_model("llama"),
        tiny_model("llama"),
        reward if reward is not None else KeywordReward("e"),
        toy_prompt_dataset(n=16),
        callbacks=callbacks,
    )


class _SignalAt(TrainerCallback):
    def __init__(self, step, sig=signal.SIGINT):
        self.step, self.sig = step, sig

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.step:
            os.kill(os.getpid(), self.sig)


def _params(trainer):
    return [p.detach().clone() for p in trainer.policy.parameters()]


@pytest.mark.slow
def test_sigterm_saves_checkpoint_and_resume_matches_uninterrupted_run(tmp_path):
    full = _trainer(tmp_path / "full")
    full.train()
    cut = _trainer(tmp_path / "cut", callbacks=[_SignalAt(2, signal.SIGTERM)])
    cut.train()  # returns normally
    assert cut.stopped_by_signal and cut.state.global_step == 2
    ckpt = latest_checkpoint(tmp_path / "cut")
    assert ckpt is not None and ckpt.name == "checkpoint-2"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    resumed = _trainer(tmp_path / "cut")
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == full.state.global_step == 4
    for a, b in zip(_params(full), _params(resumed)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class _NaNOnCalls:
    """Distinct scores 0, 1, 2, ... (so every completion has a non-zero leave-one-out advantage and a
    healthy update always moves the weights), but NaN for every completion on the given (1-based) calls."""

    def __init__(self, bad_calls):
        self.bad_calls, self.calls = set(bad_calls), 0

    def __call__(self, completions):
        self.calls += 1
        if self.calls in self.bad_calls:
            return [float("nan")] * len(completions)
        return [float(i) for i in range(len(completions))]


def test_nan_scores_skip_the_update_and_are_counted(tmp_path):
    # total_episodes 8, batch 4 (2 prompts x k=2), chunk = whole batch: one reward call per update
    reward = _NaNOnCalls({2})
    trainer = _trainer(tmp_path, reward=reward, local_rollout_forward_batch_size=64)
    before = []

    class _Snap(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            before.append(_params(trainer))

    trainer.add_callback(_Snap())
    with pytest.warns(NonFiniteStepWarning, match=r"non-finite scores"):
        trainer.train()
    after = before[1:] + [_params(trainer)]
    moved = [any(not torch.equal(a, b) for a, b in zip(x, y)) for x, y in zip(before, after)]
    assert moved == [True, False, True, True]
    assert trainer.nonfinite_guard.skipped == 1
    assert [h["skipped_nonfinite_steps"] for h in trainer.state.log_history if "loss/policy_avg" in h] == [
        0,
        1,
        1,
        1,
    ]


def test_nan_scores_every_update_stop_with_checkpoint(tmp_path):
    trainer = _trainer(tmp_path, reward=_NaNOnCalls(range(1, 100)), max_consecutive_nonfinite_steps=2)
    start = _params(trainer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteStepWarning)
        with pytest.raises(NonFiniteError, match="2 training steps in a row had a non-finite scores"):
            trainer.train()
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None
    from safetensors.torch import load_file

    saved = load_file(str(ckpt / "model.safetensors"))
    named = dict(trainer.policy.named_parameters())
    assert all(torch.equal(saved[n], p) for n, p in zip(named, start) if n in saved)
