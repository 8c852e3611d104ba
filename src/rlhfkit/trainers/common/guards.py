"""Keeping a run alive and recoverable: non-finite step guard, SIGINT/SIGTERM handling, atomic Trainer saves.

* `NonFiniteGuard` decides, identically on every rank, whether a step's loss/scores/gradients are
  finite; a bad step is skipped (no optimizer update), counted, and warned about by name. After
  `max_consecutive` bad steps in a row the caller saves the last good state and `fail()` raises.
* `GracefulStop` turns the first SIGINT/SIGTERM into a request to stop at the next step boundary
  (the trainer then saves a resumable checkpoint and returns); a second signal interrupts at once.
* `RobustTrainerMixin` wires both into a `transformers.Trainer` subclass and gives its `checkpoint-<step>`
  folders the `checkpointing` format: staged, a manifest of checksums, renamed into place, an output lock.
"""

from __future__ import annotations

import logging
import shutil
import signal
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlhfkit.core.warnings import NonFiniteStepWarning
from rlhfkit.trainers.common.checkpointing import (
    CHECKPOINT_PREFIX,
    as_write_error,
    checkpoint_to_resume,
    finish_checkpoint,
    lock_output_dir,
    peers_failed,
    prune_checkpoints,
)
from rlhfkit.trainers.common.config import check_training_sizes
from rlhfkit.trainers.common.resuming import check_resume_settings, write_training_settings
from rlhfkit.trainers.common.sharding import run_together

logger = logging.getLogger(__name__)

DEFAULT_MAX_CONSECUTIVE_NONFINITE = 3


class NonFiniteError(RuntimeError):
    """Too many non-finite steps in a row: the run stops (after saving its last good state)."""


def any_across_ranks(flag: bool, accelerator: Any = None) -> bool:
    """True when `flag` is True on any process, so all ranks take the same branch (and no collective
    hangs)."""
    if accelerator is None or getattr(accelerator, "num_processes", 1) <= 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return bool(accelerator.gather(t).max().item() > 0)


def non_finite_names(**named: Any) -> list[str]:
    """Names of the given tensors/numbers (or lists of tensors) holding a NaN or an infinity."""
    bad = []
    for name, value in named.items():
        if value is None:
            continue
        parts = value if isinstance(value, (list, tuple)) else [value]
        tensors = [
            p if isinstance(p, torch.Tensor) else torch.as_tensor(p, dtype=torch.float64)
            for p in parts
            if p is not None
        ]
        tensors = [t.detach() for t in tensors if t.is_floating_point() and t.numel() > 0]
        if tensors and not _all_finite(tensors):
            bad.append(name)
    return bad


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element of many tensors (e.g. every gradient of a model) is finite.

    Fast path: one fused 2-norm per tensor and one host sync (about 100x faster on CPU than a per-tensor
    isfinite). A NaN or infinity makes its norm non-finite; only then is the exact element-wise check run,
    because a norm can also overflow for huge but finite values.
    """
    norms = torch._foreach_norm(tensors)
    if bool(torch.isfinite(torch.stack([n.float().to(norms[0].device) for n in norms])).all()):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def loss_scaler_active(accelerator: Any) -> bool:
    """True under fp16 loss scaling, where overflowing gradients are expected and handled by GradScaler.

    The scaler skips such an update and lowers its scale; it must see those gradients, and its early
    overflows (the scale starts high on purpose) are not bad steps, so the guards leave gradients to it.
    """
    return getattr(accelerator, "scaler", None) is not None


class NonFiniteGuard:
    """Counts skipped steps and stops the run after `max_consecutive` of them in a row (None: never)."""

    def __init__(self, max_consecutive: int | None = DEFAULT_MAX_CONSECUTIVE_NONFINITE):
        if max_consecutive is not None and (not isinstance(max_consecutive, int) or max_consecutive < 1):
            raise ValueError(f"max_consecutive must be a positive integer or None, got {max_consecutive!r}")
        self.max_consecutive = max_consecutive
        self.skipped = 0
        self.consecutive = 0
        self.last_cause = ""
        self._last_problem = ""  # what the caller found wrong, when it was not a non-finite value

    @property
    def exhausted(self) -> bool:
        return self.max_consecutive is not None and self.consecutive >= self.max_consecutive

    def check(
        self,
        step: int | None = None,
        accelerator: Any = None,
        *,
        ends_bad_run: bool = True,
        problem: str | None = None,
        **named: Any,
    ) -> bool:
        """True when every named value is finite on every rank; otherwise count, warn and return False.

        `problem`: a reason the caller already found to skip the step (e.g. "no usable reward: ..."), worded
        to follow "skipped step 3:" and "2 steps in a row had"; it counts like a non-finite value.
        A pre-check that passes (e.g. the scores, before the gradients are known) should not end a run of
        bad steps: pass `ends_bad_run=False` for it.
        """
        bad = non_finite_names(**named)
        if not any_across_ranks(bool(bad) or bool(problem), accelerator):
            if ends_bad_run:
                self.consecutive = 0
            return True
        self.skipped += 1
        self.consecutive += 1
        self.last_cause = ", ".join(bad) if bad or problem else "a value on another process"
        self._last_problem = problem or ""
        where = f"step {step}" if step is not None else "a step"
        limit = f" of at most {self.max_consecutive}" if self.max_consecutive is not None else ""
        causes = [f"non-finite {self.last_cause} (NaN or inf)"] if self.last_cause else []
        warnings.warn(
            f"skipped {where}: {'; '.join([problem, *causes] if problem else causes)}; no optimizer update. "
            f"{self.consecutive} in a row{limit}, {self.skipped} skipped in total",
            NonFiniteStepWarning,
            stacklevel=2,
        )
        return False

    def fail_if_exhausted(self, save_last_good: Callable[[], str | Path | None]) -> None:
        """After `max_consecutive` bad steps in a row: save the last good state, then raise NonFiniteError.

        `save_last_good()` writes the checkpoint and returns where (None: nothing was saved).
        """
        if self.exhausted:
            self.fail(save_last_good())

    def fail(self, checkpoint: str | Path | None = None) -> None:
        saved = f"; the last good state was saved to {checkpoint}" if checkpoint else ""
        cause = self._last_problem or f"a non-finite {self.last_cause}"
        raise NonFiniteError(
            f"{self.consecutive} training steps in a row had {cause}{saved}. "
            "Lower the learning rate, check the reward/scores for NaN or inf, or enable gradient clipping "
            "(max_grad_norm); raise the limit with max_consecutive_nonfinite_steps"
        )

    def stats(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}skipped_nonfinite_steps": float(self.skipped)}

    def state_dict(self) -> dict[str, int]:
        return {"skipped": self.skipped, "consecutive": self.consecutive}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skipped, self.consecutive = int(state["skipped"]), int(state["consecutive"])


class GracefulStop:
    """Context manager: SIGINT/SIGTERM set `requested` instead of killing the step half-way.

    The trainer polls `should_stop(accelerator)` between steps; on True it saves a checkpoint and returns.
    A second signal restores the previous handlers and raises KeyboardInterrupt immediately. Outside the
    main thread (where Python cannot install handlers) it does nothing. `exit_code` is what a command
    stopped this way exits with: 128 + the signal number (130 for SIGINT, 143 for SIGTERM), as a shell
    reports a process the signal ended.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""
        self.signum = 0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            self.uninstall()
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping without a checkpoint")
        self.requested = True
        self.signum, self.signal_name = int(signum), signal.Signals(signum).name
        logger.warning(
            "%s received: saving a checkpoint after the current step, then stopping", self.signal_name
        )

    def install(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread() and not self._previous:
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def should_stop(self, accelerator: Any = None) -> bool:
        return any_across_ranks(self.requested, accelerator)

    @property
    def exit_code(self) -> int:
        """128 + the signal's number; SIGTERM's (143) on a process that only heard of it from another."""
        return 128 + (self.signum or int(signal.SIGTERM))

    def __enter__(self) -> GracefulStop:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()


def _trainer_callback_class() -> type:
    from transformers import TrainerCallback

    class RobustnessCallback(TrainerCallback):
        """Skips non-finite optimizer steps and turns a stop request into save-and-stop."""

        def __init__(self, trainer: Any):
            self.trainer = trainer

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            tr = self.trainer
            loss, tr._nonfinite_loss = tr._nonfinite_loss, None
            if not tr.check_step_is_finite(tr.model, loss=loss) and not loss_scaler_active(tr.accelerator):
                tr.model.zero_grad(set_to_none=True)  # no grads: the optimizer leaves every parameter alone

        def on_step_end(self, args, state, control, **kwargs):
            if self.trainer.graceful_stop.should_stop(self.trainer.accelerator):
                logger.warning("stopping at step %d on request; saving a checkpoint", state.global_step)
                control.should_save = True
                control.should_training_stop = True
                self.trainer.stopped_by_signal = True  # a command exits `graceful_stop.exit_code`
            return control

    return RobustnessCallback


class RobustTrainerMixin:
    """Put before `transformers.Trainer` in a trainer's bases:
    `class SFTTrainer(RobustTrainerMixin, Trainer)`.

    Adds: atomic checkpoint folders, save-and-stop on SIGINT/SIGTERM, skipping of non-finite steps with
    `args.max_consecutive_nonfinite_steps` (default 3) in a row allowed before the run stops, and the
    output folder's lock taken when train() starts (whatever the save strategy). After train(),
    `stopped_by_signal` says whether a signal ended it early (`graceful_stop.signal_name`, `.exit_code`)
    and `last_checkpoint` is the last checkpoint folder this run wrote (None: none).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        check_training_sizes(self.args)
        tok = getattr(self, "processing_class", None)
        if tok is not None and hasattr(tok, "pad_token_id") and tok.pad_token_id is None:
            if getattr(tok, "eos_token_id", None) is None:  # batches could not be padded
                raise ValueError(
                    f"{type(self).__name__}: the tokenizer has neither a pad nor an eos token; "
                    "set tokenizer.pad_token (e.g. tokenizer.add_special_tokens({'pad_token': '<pad>'}))"
                )
        limit = getattr(self.args, "max_consecutive_nonfinite_steps", DEFAULT_MAX_CONSECUTIVE_NONFINITE)
        self.nonfinite_guard = NonFiniteGuard(limit)
        self.graceful_stop = GracefulStop()
        self.stopped_by_signal = False
        self.last_checkpoint: str | None = None
        self._nonfinite_loss: torch.Tensor | None = None
        self.add_callback(_trainer_callback_class()(self))

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        *args: Any,
        trust_unverified_checkpoint: bool = False,
        **kwargs: Any,
    ):
        """Trainer.train; `trust_unverified_checkpoint=True` resumes from a folder without a manifest."""
        checkpoint = self._begin_run(resume_from_checkpoint, trust_unverified_checkpoint)
        with self.graceful_stop:
            return super().train(None if checkpoint is None else str(checkpoint), *args, **kwargs)

    def _begin_run(self, resume_from_checkpoint: str | bool | None, trust: bool = False) -> Path | None:
        """What every train() does first: take the output folder's lock (a second run on it stops here, by
        name, before any work), find and verify the checkpoint to resume (None: a fresh run), and check the
        settings against it (`resuming.check_resume_settings`)."""
        if self.args.should_save:
            lock_output_dir(self.args.output_dir)
        self.stopped_by_signal, self.last_checkpoint = False, None
        checkpoint = checkpoint_to_resume(self.args.output_dir, resume_from_checkpoint, trust)
        if checkpoint is not None:
            check_resume_settings(checkpoint, self.args)
        return checkpoint

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        loss = super().training_step(*args, **kwargs)
        if not bool(torch.isfinite(loss).all()):
            self._nonfinite_loss = loss.detach()  # named as the cause if the step is then skipped
        return loss

    def check_step_is_finite(self, model: Any, **named: Any) -> bool:
        """Before an optimizer step: are the gradients (and `named` values) finite on every rank?

        When not, the step is counted and warned about; after too many in a row the last good state is
        saved as a checkpoint and NonFiniteError is raised. Under fp16 loss scaling the gradients are the
        GradScaler's to check (see `loss_scaler_active`).
        """
        scaled = loss_scaler_active(self.accelerator)
        grads = [] if scaled else [p.grad for p in model.parameters() if p.grad is not None]
        step = self.state.global_step + 1
        if self.nonfinite_guard.check(step=step, accelerator=self.accelerator, **named, gradients=grads):
            return True

        def save_last_good() -> Path:
            model.zero_grad(set_to_none=True)
            self._save_checkpoint(model, trial=None)
            return Path(self._get_output_dir(trial=None)) / f"checkpoint-{self.state.global_step}"

        self.nonfinite_guard.fail_if_exhausted(save_last_good)
        return False

    def guarded_optimizer_step(self, model: Any, **named: Any) -> bool:
        """`optimizer.step()` for hand-written loops, skipped when `check_step_is_finite` says no.

        Under fp16 loss scaling the step always reaches the GradScaler, which skips a non-finite update
        itself.
        """
        if self.check_step_is_finite(model, **named) or loss_scaler_active(self.accelerator):
            self.optimizer.step()
            return True
        return False

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if any(k == "loss" or k.startswith("loss/") for k in logs):  # training logs only
            logs = {**logs, **self.nonfinite_guard.stats()}
        super().log(logs, *args, **kwargs)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Let Trainer write `checkpoint-<step>` into a staging folder, then add the manifest and publish it.

        Trainer's own files stay as they are (optimizer.pt, scheduler.pt and rng_state.pth are torch.save
        files that transformers reads back with weights_only=True). Retention is `args.save_total_limit`.
        """
        run_dir = Path(self._get_output_dir(trial=trial))
        final = run_dir / f"{CHECKPOINT_PREFIX}{self.state.global_step}"
        staged = run_dir / f".{final.name}.tmp-trainer" / final.name  # the same path on every rank
        trainer_save, main = super()._save_checkpoint, self.args.should_save
        failed = peers_failed(staged, final)

        def start() -> None:
            lock_output_dir(run_dir)
            for stale in run_dir.glob(f".{CHECKPOINT_PREFIX}*.tmp-*"):  # left by a run killed mid-save
                shutil.rmtree(stale, ignore_errors=True)
            staged.parent.mkdir(parents=True)

        def write() -> None:  # on every process: FSDP and DeepSpeed write a shard each
            original = self.args.output_dir
            self.args.output_dir = str(staged.parent)  # Trainer derives the checkpoint folder from output_dir
            try:
                trainer_save(model, trial)
            except Exception as err:  # `failed` discards the staging folder once every process is done
                raise as_write_error(err, final)  # noqa: B904 - a mapped error has `err` as its cause
            finally:
                self.args.output_dir = original

        def publish() -> None:
            write_training_settings(staged, self.args)  # compared with a resumed run's (`resuming`)
            finish_checkpoint(staged, final, self.state.global_step)
            best = self.state.best_model_checkpoint
            if best and str(staged.parent) in best:
                self.state.best_model_checkpoint = best = best.replace(str(staged.parent), str(run_dir))
            prune_checkpoints(run_dir, self.args.save_total_limit, protect=(str(final), best or ""))

        for part in (start if main else None, write, publish if main else None):
            run_together(part or (lambda: None), failed)  # a barrier would wait for the timeout
        self.last_checkpoint = str(final)
