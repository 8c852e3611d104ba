"""`ReferenceHolder`: the frozen reference of an offline preference trainer (DPO, KTO), held one way.

The trainer keeps a `rlhfkit.models.reference.Reference` in `self.reference` (None: no reference, DPO's
reference_free). `ref_model` is TRL's attribute: the separate reference network, or None when the reference
lives inside a PEFT policy; `_reference()` yields the module to run for reference log-probs, without
gradients. `SyncReferenceCallback` is TR-DPO's soft update of that separate network (`sync_ref_model`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn
from transformers import TrainerCallback

from rlhfkit.models.reference import Reference, choose_reference, mix_into_reference


class ReferenceHolder:
    """Mixed into a `transformers.Trainer` subclass that sets `self.reference` in its set-up."""

    reference: Reference | None

    @property
    def ref_model(self) -> nn.Module | None:
        """The separate reference network, or None when the reference lives inside the PEFT policy."""
        return self.reference.model if self.reference is not None else None

    @ref_model.setter
    def ref_model(self, value: nn.Module | None) -> None:  # e.g. replaced by its accelerate-prepared self
        if self.reference is not None:
            self.reference.model = value
        elif value is not None:
            self.reference = choose_reference(None, value)

    @contextlib.contextmanager
    def _reference(self) -> Iterator[nn.Module]:
        """Yield the reference network (no gradients): the ref model, or the PEFT policy in reference mode."""
        if self.reference is None:
            raise RuntimeError(f"{type(self).__name__}: no reference model (reference_free is set)")
        with self.reference(self.accelerator.unwrap_model(self.model)) as ref:
            yield ref


class SyncReferenceCallback(TrainerCallback):
    """TR-DPO: every `ref_model_sync_steps` optimizer steps, ref <- alpha * policy + (1 - alpha) * ref."""

    def __init__(self, trainer: ReferenceHolder):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.ref_model_sync_steps == 0:
            trainer = self.trainer
            reference = trainer.accelerator.unwrap_model(trainer.ref_model)
            policy = trainer.accelerator.unwrap_model(trainer.model)
            mix_into_reference(reference, policy, args.ref_model_mixup_alpha)
