"""Dropout off for a while (scoring, sampling), without disturbing submodules a caller froze in eval."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Temporarily switch off dropout; afterwards restore every submodule's own train/eval mode.

    Restoring per submodule (not `model.train(was_training)`) keeps parts that were deliberately in eval,
    such as a frozen reference or reward head, in eval.
    """
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, mode in modes:
            module.training = mode
