"""GRPOTrainer's entropy bonus state: the coefficient (`entropy_coef`, adapted with `use_adaptive_entropy`),
the entropy measured over the current optimizer step, and what a checkpoint keeps of them. The maths is
`core.entropy`."""

from __future__ import annotations

from typing import Any

import torch

from rlhfkit.core.entropy import adapt_entropy_coef, applied_entropy_coef


class EntropyControl:
    """One per trainer. `enabled` is fixed for the run: a non-zero coefficient, or adaptive control (which
    may bring a coefficient that fell to 0 back)."""

    def __init__(self, args: Any) -> None:
        self.args = args
        self.coef = float(getattr(args, "entropy_coef", 0.0))
        self.adaptive = bool(getattr(args, "use_adaptive_entropy", False))
        self.enabled = self.coef != 0.0 or self.adaptive
        self.last_entropy = float("inf")  # nothing measured yet: adaptive control applies no bonus
        self._window = torch.zeros(2, dtype=torch.float64)  # entropy sum, token count of this step

    def applied(self) -> float:
        """The coefficient of this step's loss (every micro-batch of a step uses the same one)."""
        return applied_entropy_coef(self.coef, self.last_entropy, self.args.entropy_target, self.adaptive)

    def observe(self, entropies: torch.Tensor, mask: torch.Tensor) -> None:
        """Add a micro-batch's trained tokens to this step's entropy measurement."""
        mask = mask.bool()
        self._window += torch.tensor([float(entropies.detach()[mask].sum()), float(mask.sum())])

    def end_step(self, reduce_sum: Any) -> float:
        """After the optimizer step: the step's mean entropy over every process (`reduce_sum` sums a tensor
        across processes) sets the next coefficient. Returns the coefficient to log."""
        if self.adaptive:
            total = reduce_sum(self._window)
            entropy = float(total[0] / total[1]) if total[1] > 0 else float("nan")
            args = self.args
            self.coef = adapt_entropy_coef(
                self.coef, entropy, args.entropy_target, args.entropy_coef_delta,
                args.entropy_coef_min, args.entropy_coef_max,
            )  # fmt: skip
            self.last_entropy = entropy if entropy == entropy else self.last_entropy
        self._window.zero_()
        return self.coef

    def state(self) -> dict[str, float]:
        return {"entropy_coef": self.coef, "last_entropy": self.last_entropy}

    def load(self, state: dict[str, float]) -> None:
        self.coef, self.last_entropy = float(state["entropy_coef"]), float(state["last_entropy"])
