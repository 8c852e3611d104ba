"""NonFiniteGuard and GracefulStop on their own, then wired into a transformers.Trainer via the mixin."""

from __future__ import annotations

import math
import os
import signal
import warnings

import pytest
import torch
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments

from rlhfkit.trainers.common.checkpointing import LOCK_FILE, latest_checkpoint
from rlhfkit.trainers.common.guards import (
    GracefulStop,
    NonFiniteError,
    NonFiniteGuard,
    NonFiniteStepWarning,
    RobustTrainerMixin,
    non_finite_names,
)

# ---------------------------------------------------------------- NonFiniteGuard


def test_non_finite_names_finds_each_bad_value():
    ok = torch.ones(3)
    assert non_finite_names(loss=ok, scores=[ok, ok], lr=0.1, missing=None) == []
    bad = non_finite_names(loss=torch.tensor(float("nan")), scores=[ok, torch.tensor([1.0, math.inf])], x=ok)
    assert bad == ["loss", "scores"]
    assert non_finite_names(ids=torch.tensor([1, 2])) == []  # integer tensors are always finite


def test_guard_skips_counts_warns_and_resets():
    guard = NonFiniteGuard(max_consecutive=3)
    assert guard.check(step=1, loss=torch.tensor(1.0))
    with pytest.warns(NonFiniteStepWarning, match=r"step 2: non-finite scores"):
        assert not guard.check(step=2, loss=torch.tensor(1.0), scores=torch.tensor([0.0, float("nan")]))
    with pytest.warns(NonFiniteStepWarning, match="2 in a row of at most 3, 2 skipped in total"):
        assert not guard.check(step=3, loss=torch.tensor(float("inf")))
    assert (guard.skipped, guard.consecutive, guard.exhausted) == (2, 2, False)
    assert guard.check(step=4, loss=torch.tensor(0.5))  # a good step resets the run of bad ones
    assert (guard.skipped, guard.consecutive) == (2, 0)
    assert guard.stats() == {"skipped_nonfinite_steps": 2.0}


def test_guard_exhausts_after_limit_and_fails_clearly():
    guard = NonFiniteGuard(max_consecutive=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteStepWarning)
        guard.check(loss=float("nan"))
        assert not guard.exhausted
        guard.check(loss=float("nan"))
    assert guard.exhausted
    with pytest.raises(
        NonFiniteError, match=r"2 training steps in a row had a non-finite loss; .* saved to /ck"
    ):
        guard.fail("/ck")


def test_guard_state_round_trip_and_validation():
    guard = NonFiniteGuard(5)
    guard.load_state_dict({"skipped": 4, "consecutive": 1})
    other = NonFiniteGuard(5)
    other.load_state_dict(guard.state_dict())
    assert (other.skipped, other.consecutive) == (4, 1)
    assert not NonFiniteGuard(None).exhausted
    for bad in (0, -1, 1.5, "3"):
        with pytest.raises(ValueError, match="max_consecutive must be a positive integer"):
            NonFiniteGuard(bad)


# ---------------------------------------------------------------- GracefulStop


def test_graceful_stop_first_signal_requests_second_interrupts():
    before = signal.getsignal(signal.SIGINT)
    with GracefulStop() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signal_name == "SIGTERM" and stop.should_stop()
        with pytest.raises(KeyboardInterrupt, match="second SIGINT"):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored


# ---------------------------------------------------------------- the mixin on a tiny Trainer

N_ROWS = 8


class _Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 1)

    def forward(self, x, y):
        return {"loss": nn.functional.mse_loss(self.lin(x).squeeze(-1), y)}


class _Rows(torch.utils.data.Dataset):
    def __init__(self, nan_rows=()):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(N_ROWS, 3, generator=g), torch.randn(N_ROWS, generator=g)
        for i in nan_rows:
            self.y[i] = float("nan")

    def __len__(self):
        return N_ROWS

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


class _RobustTrainer(RobustTrainerMixin, Trainer):
    pass


def _args(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path), per_device_train_batch_size=1, max_steps=N_ROWS, learning_rate=0.1,
        save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, logging_steps=1, seed=0,
        lr_scheduler_type="constant", dataloader_drop_last=True,
    )  # fmt: skip
    base.update(kw)
    return TrainingArguments(**base)


class _Recorder(TrainerCallback):
    """Parameters after every optimizer step, and a signal sent at a chosen step."""

    def __init__(self, signal_at=None):
        self.params, self.signal_at = [], signal_at

    def on_step_end(self, args, state, control, model=None, **kw):
        self.params.append(torch.cat([p.detach().clone().reshape(-1) for p in model.parameters()]))
        if state.global_step == self.signal_at:
            os.kill(os.getpid(), signal.SIGINT)


def _train(tmp_path, data, args_kw=None, signal_at=None, resume=None):
    rec = _Recorder(signal_at)
    tr = _RobustTrainer(model=_Regressor(), args=_args(tmp_path, **(args_kw or {})), train_dataset=data)
    tr.add_callback(rec)
    tr.train(resume_from_checkpoint=resume)
    return tr, rec


def test_nan_step_is_skipped_counted_and_named(tmp_path):
    # one row has a NaN target, so exactly one step (batch size 1) has a NaN loss and must leave the
    # weights alone
    with pytest.warns(NonFiniteStepWarning, match="non-finite loss, gradients"):
        tr, rec = _train(tmp_path, _Rows(nan_rows=[2]))
    assert tr.nonfinite_guard.skipped == 1
    moved = [not torch.equal(a, b) for a, b in zip(rec.params, rec.params[1:])]
    assert moved.count(False) == 1  # one step left the weights alone, all the others moved them
    assert all(torch.isfinite(p).all() for p in rec.params)
    logged = [h for h in tr.state.log_history if "skipped_nonfinite_steps" in h]
    assert logged and logged[-1]["skipped_nonfinite_steps"] == 1.0


def test_too_many_nonfinite_steps_stop_with_checkpoint_of_last_good_state(tmp_path):
    data = _Rows(nan_rows=range(N_ROWS))  # every step is bad
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteStepWarning)
        with pytest.raises(NonFiniteError, match="2 training steps in a row had a non-finite loss"):
            _train_with_limit(tmp_path, data)
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None and (ckpt / "model.safetensors").exists()
    from safetensors.torch import load_file

    saved = load_file(str(ckpt / "model.safetensors"))
    fresh = _Regressor().state_dict()
    assert all(torch.equal(saved[k], fresh[k]) for k in fresh)  # nothing was ever applied


def _train_with_limit(tmp_path, data):
    args = _args(tmp_path, max_steps=4)
    args.max_consecutive_nonfinite_steps = 2
    tr = _RobustTrainer(model=_Regressor(), args=args, train_dataset=data)
    tr.train()


@pytest.mark.slow
def test_sigint_saves_checkpoint_and_resume_continues_exactly(tmp_path):
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    _, full = _train(full_dir, _Rows())
    handler_before = signal.getsignal(signal.SIGINT)  # SIG_IGN when pytest itself runs as a background job
    # the signal arrives during step 3's callbacks (after the stop check): the step after it is the last
    tr, cut = _train(cut_dir, _Rows(), signal_at=3)
    assert tr.stopped_by_signal and tr.state.global_step == 4
    ckpt = latest_checkpoint(cut_dir)
    assert ckpt == cut_dir / "checkpoint-4"
    assert not [
        p for p in cut_dir.iterdir() if p.name.startswith(".") and p.name != LOCK_FILE
    ]  # no staging leftovers
    assert signal.getsignal(signal.SIGINT) is handler_before  # restored
    _, resumed = _train(cut_dir, _Rows(), resume=str(ckpt))
    torch.testing.assert_close(cut.params[-1], full.params[3], rtol=0, atol=0)
    torch.testing.assert_close(resumed.params[-1], full.params[-1], rtol=0, atol=0)


def test_atomic_trainer_saves_rotate_and_leave_no_staging(tmp_path):
    tr, _ = _train(
        tmp_path, _Rows(), args_kw={"save_strategy": "steps", "save_steps": 2, "save_total_limit": 2}
    )
    names = sorted(p.name for p in tmp_path.glob("checkpoint*"))
    assert names == ["checkpoint-6", "checkpoint-8"]
    assert (tmp_path / "checkpoint-8" / "trainer_state.json").exists()
