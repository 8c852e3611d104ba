"""KTO's losses (Ethayarajh et al. 2024, "Model Alignment as Prospect Theoretic Optimization").

KTO learns from unpaired completions, each labelled desirable or undesirable. With the implicit reward
r = log pi(y|x) - log ref(y|x) and a reference point z (an estimate of KL(pi || ref)), a desirable
completion costs 1 - sigmoid(beta (r - z)) and an undesirable one 1 - sigmoid(beta (z - r)), scaled by
desirable_weight / undesirable_weight (the paper's lambda_D, lambda_U).

Where this departs from the paper, as TRL does: z is estimated from the batch itself, by scoring each
prompt with another row's completion (a mismatched pair), averaging r over those pairs, clamping at 0 and
stopping its gradient; the paper's value function v(x, y) is then weighted by lambda and the per-row
losses averaged over the batch. "apo_zero_unpaired" (D'Oosterlinck et al. 2024) is the same pair of
losses with z = 0: it pushes desirable completions above the reference and undesirable ones below it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def kto_reference_point(
    policy_kl_logps: torch.Tensor,
    reference_kl_logps: torch.Tensor,
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """z_ref: the batch-mean log-ratio of the mismatched (prompt, completion) pairs, clamped at 0, detached.

    Args:
        policy_kl_logps, reference_kl_logps: (B,) summed log-probs of each prompt followed by another row's
            completion, under the policy and the reference.
        gather: with several processes, collects the per-process means (1 value each) so every process
            uses the same z; None on one process.
    Returns: a 0-dim tensor >= 0 without gradient. Clamped because a KL divergence is never negative; a
    negative batch estimate is noise.
    """
    local = (policy_kl_logps - reference_kl_logps).detach().float().mean()
    if gather is not None:
        local = gather(local.reshape(1)).mean()
    return local.clamp(min=0)


def kto_losses(
    logratios: torch.Tensor, reference_point: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(desirable_losses, undesirable_losses), (B,) each, for rows with log-ratios `logratios` (B,):
    1 - sigmoid(beta (r - z)) if the row were desirable, 1 - sigmoid(beta (z - r)) if undesirable."""
    margin = beta * (logratios - reference_point)
    return 1 - torch.sigmoid(margin), 1 - torch.sigmoid(-margin)


def apo_zero_unpaired_losses(
    logratios: torch.Tensor, reference_point: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """APO-zero on unpaired rows: 1 - sigmoid(beta r) if desirable, sigmoid(beta r) if undesirable.

    `reference_point` is ignored: this loss measures against the reference itself (z = 0)."""
    return 1 - torch.sigmoid(beta * logratios), torch.sigmoid(beta * logratios)


# loss_type -> f(logratios (B,), z, beta) -> (loss if desirable, loss if undesirable), (B,) each
KTO_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "kto": kto_losses,
    "apo_zero_unpaired": apo_zero_unpaired_losses,
}
# the losses that use the reference point, hence the mismatched pairs that estimate it
KTO_LOSSES_WITH_REFERENCE_POINT = ("kto",)


def kto_loss(
    policy_logps: torch.Tensor,
    reference_logps: torch.Tensor,
    labels: torch.Tensor,
    reference_point: torch.Tensor | float = 0.0,
    *,
    beta: float = 0.1,
    loss_type: str = "kto",
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(losses, rewards), (B,) each, for B unpaired completions.

    Args:
        policy_logps, reference_logps: (B,) summed completion log-probs under the policy and the reference.
        labels: (B,) bool, True = desirable.
        reference_point: z from `kto_reference_point` (ignored by "apo_zero_unpaired").
    Returns: each row's weighted loss (the training loss is their mean) and its implicit reward
    beta * (log pi - log ref), detached.
    """
    if loss_type not in KTO_LOSSES:
        raise ValueError(f"loss_type must be one of {sorted(KTO_LOSSES)}, got {loss_type!r}")
    logratios = policy_logps - reference_logps
    z = torch.as_tensor(reference_point, dtype=logratios.dtype, device=logratios.device)
    if_desirable, if_undesirable = KTO_LOSSES[loss_type](logratios, z, beta)
    labels = labels.to(device=logratios.device, dtype=torch.bool)
    losses = torch.where(labels, desirable_weight * if_desirable, undesirable_weight * if_undesirable)
    return losses, beta * logratios.detach()


def balanced_weight_ranges(
    num_desirable: int, num_undesirable: int, desirable_weight: float, undesirable_weight: float
) -> tuple[tuple[float, float], tuple[float, float]]:
    """The ranges the paper recommends (its Eq. 8) for each weight when the other is kept:
    1 <= desirable_weight * n_D / (undesirable_weight * n_U) <= 4/3.

    Returns ((low, high) for desirable_weight, (low, high) for undesirable_weight), rounded to 2 digits;
    counts of 0 are taken as 1.
    """
    n_d, n_u = max(num_desirable, 1), max(num_undesirable, 1)
    desirable = (round(n_u * undesirable_weight / n_d, 2), round(n_u * undesirable_weight / n_d * 4 / 3, 2))
    undesirable = (round(n_d * desirable_weight / n_u * 3 / 4, 2), round(n_d * desirable_weight / n_u, 2))
    return desirable, undesirable
