"""The warning a skipped training step raises, wherever the non-finite value is first seen.

Reward scoring warns when a score is NaN or infinite (`rlhfkit.rewards.scoring`); the trainers' guard
(`rlhfkit.trainers.common.guards.NonFiniteGuard`) warns about losses and gradients. Both use this one
class, so a user filters or catches one warning.
"""


class NonFiniteStepWarning(RuntimeWarning):
    """A training step was skipped because a loss, score or gradient was NaN or infinite."""
