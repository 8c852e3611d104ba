"""PPOTrainer keeps a run: NaN scores skip the step (without poisoning the running score statistics),
too many in a row stop with the last good state saved, and `rlhfkit ppo` saves and exits on SIGINT."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from rlhfkit import PPOConfig, PPOTrainer
from rlhfkit.testing import tiny_tokenizer, tiny_value_head_model
from rlhfkit.trainers.common.checkpointing import validate_checkpoint
from rlhfkit.trainers.common.guards import NonFiniteError, NonFiniteStepWarning

QUERY_TEXTS = ["the film was", "a story about", "we saw it", "the cast"]


def _trainer(**kw):
    tok = tiny_tokenizer()
    model = tiny_value_head_model("llama")
    cfg = dict(
        batch_size=4, mini_batch_size=2, ppo_epochs=1, learning_rate=1e-3, seed=7, use_score_scaling=True
    )
    cfg.update(kw)
    return PPOTrainer(PPOConfig(**cfg), model, tokenizer=tok), tok


def _params(trainer):
    return torch.cat([p.detach().reshape(-1).clone() for p in trainer.model.parameters()])


def _step(trainer, tok, bad=False):
    queries = [torch.tensor(tok.encode(t)) for t in QUERY_TEXTS]
    responses = trainer.generate(queries, return_prompt=False, max_new_tokens=4, do_sample=True)
    scores = [
        torch.tensor(float("nan") if bad and i == 1 else float(len(r))) for i, r in enumerate(responses)
    ]
    return trainer.step(queries, responses, scores)


def test_nan_scores_skip_the_step_and_keep_running_moments_clean():
    trainer, tok = _trainer()
    _step(trainer, tok)
    before, moments = _params(trainer), trainer.running.state_dict()
    with pytest.warns(NonFiniteStepWarning, match="step 2: non-finite scores"):
        stats = _step(trainer, tok, bad=True)
    assert stats["ppo/step_skipped"] == 1.0 and stats["ppo/skipped_nonfinite_steps"] == 1.0
    assert math.isnan(stats["ppo/mean_scores"])  # every other statistic reads NaN for a skipped step
    assert torch.equal(_params(trainer), before) and trainer.current_step == 1
    assert trainer.running.state_dict() == moments
    stats = _step(trainer, tok)  # the run goes on
    assert trainer.current_step == 2 and stats["ppo/skipped_nonfinite_steps"] == 1.0
    assert not torch.equal(_params(trainer), before)


def test_nan_gradients_skip_the_optimizer_step():
    trainer, tok = _trainer()
    _step(trainer, tok)
    before = _params(trainer)
    head = trainer.model.v_head.summary  # poison one gradient just before the optimizer would use it
    hook = head.weight.register_hook(lambda g: g * float("nan"))
    with pytest.warns(NonFiniteStepWarning, match="non-finite gradients"):
        _step(trainer, tok)
    hook.remove()
    assert torch.equal(_params(trainer), before)
    assert trainer.nonfinite_guard.skipped == 2  # two optimizer steps per PPO step (batch 4, minibatch 2)


def test_consecutive_nan_steps_stop_with_last_good_checkpoint(tmp_path):
    trainer, tok = _trainer(max_consecutive_nonfinite_steps=2)
    _step(trainer, tok)
    trainer.save_checkpoint(str(tmp_path / "ckpt"))
    _step(trainer, tok)  # a good step after the save: the failure must save this newer state
    good = _params(trainer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteStepWarning)
        _step(trainer, tok, bad=True)
        with pytest.raises(NonFiniteError, match=r"2 training steps in a row had a non-finite scores.*ckpt"):
            _step(trainer, tok, bad=True)
    restored, _ = _trainer(max_consecutive_nonfinite_steps=2)
    restored.load_checkpoint(str(tmp_path / "ckpt"))
    assert restored.current_step == 2
    assert torch.equal(_params(restored), good)


@pytest.mark.slow
def test_ppo_command_saves_and_exits_cleanly_on_sigint(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlhfkit", "ppo", "--dataset_name", "length", "--steps", "200",
           "--batch_size", "4", "--mini_batch_size", "2", "--ppo_epochs", "1", "--max_new_tokens", "4",
           "--output_dir", str(out)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    try:
        deadline = time.monotonic() + 240
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("step 1/"):
                proc.send_signal(signal.SIGINT)
                break
            assert time.monotonic() < deadline, "no training step within the time limit"
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "".join(lines) + (rest or "")
    assert proc.returncode == 130, output[-3000:]  # interrupted: not a success, and no final model
    assert "stopped on request" in output and not (out / "model.safetensors").exists()
    saved = Path(
        output.split("--resume_from_checkpoint ")[1].split()[0]
    )  # checkpoint-<the step it stopped after>
    assert saved.parent == out and saved.name.startswith("checkpoint-")
    validate_checkpoint(saved)
    assert (saved / "trainer_state.json").exists()
