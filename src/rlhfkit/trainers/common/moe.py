"""Mixture-of-experts load balancing: TRL 1.x's `router_aux_loss_coef`, written once for every trainer.

A mixture-of-experts causal LM routes each token to a few experts; left alone, training tends to send
most tokens to the same experts. Such a model's config declares `output_router_logits`: with it on, the
model's forward also returns `aux_loss`, its architecture's load-balancing loss over the routers of every
layer, computed by transformers' own function for that architecture. The trainers add coef × aux_loss to
their loss and log `aux_loss`.

`RouterAuxLoss.resolve` decides once per trainer whether the term is on and with which coefficient
(None: the model config's own, 0: off; a coefficient for a model without routers is an error).
`collect(model)` wraps the policy's training forward passes: it asks the model for router logits (and a
model whose config turns them on, while the term is off, not to compute them) and gathers each pass's
`aux_loss`, wherever the forward is called from. The chunked LM-head path (`rollout.lm_head.forward_hidden`)
runs the model's own forward too, so its output carries `aux_loss` as the full-logits path's does: no
separate router pass is needed there.

The model adds its own coefficient × aux to the loss it computes from `labels`; rlhfkit's trainers compute
their losses themselves (SFT included, while the term is on), so the coefficient added is always the
resolved one.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn


def text_config(model: nn.Module | None):
    """The config of a model's language part (a vision-language model keeps it under `text_config`)."""
    config = getattr(model, "config", None)
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def router_module(model: nn.Module) -> nn.Module | None:
    """The outermost module inside any wrappers (DDP, PEFT) whose forward takes `output_router_logits`."""
    for module in model.modules():
        if "output_router_logits" in inspect.signature(type(module).forward).parameters:
            return module
    return None


@dataclass(frozen=True)
class RouterAuxLoss:
    """The resolved load-balancing term of one trainer: `coef` and whether it is added (`enabled`)."""

    coef: float = 0.0
    enabled: bool = False
    has_routers: bool = False  # the model declares output_router_logits (then it is told, on or off)

    @classmethod
    def resolve(cls, model: nn.Module | None, coef: float | None, owner: str) -> RouterAuxLoss:
        """TRL 1.x's rule: on when the model config has `output_router_logits` and the coefficient (given,
        else the config's `router_aux_loss_coef`, else 0) is not zero."""
        config = text_config(model)
        has_routers = config is not None and hasattr(config, "output_router_logits")
        if coef and not has_routers:
            raise ValueError(
                f"{owner}: router_aux_loss_coef={coef} is set, but {type(model).__name__} is not a "
                "mixture-of-experts model (its config has no `output_router_logits`), so there is no "
                "load-balancing loss to weight; leave router_aux_loss_coef=None"
            )
        if coef is None:
            coef = float(getattr(config, "router_aux_loss_coef", 0.0) or 0.0) if has_routers else 0.0
        enabled = has_routers and coef != 0
        if enabled and router_module(model) is None:
            raise ValueError(
                f"{owner}: router_aux_loss_coef={coef}, but the forward of {type(model).__name__} takes no "
                "`output_router_logits`, so it cannot return its load-balancing loss; set "
                "router_aux_loss_coef=0 to train without it"
            )
        return cls(float(coef), enabled, has_routers)

    @contextlib.contextmanager
    def collect(self, model: nn.Module) -> Iterator[list[torch.Tensor]]:
        """Within the block, `model`'s forward passes are told `output_router_logits=enabled`; the list
        yielded receives the `aux_loss` of each pass (empty when the term is off)."""
        found: list[torch.Tensor] = []
        target = router_module(model) if self.has_routers else None
        if target is None:
            yield found
            return

        def ask(_module, args, kwargs):
            return args, {**kwargs, "output_router_logits": self.enabled}

        def keep(_module, _args, _kwargs, output):
            aux = getattr(output, "aux_loss", None)
            if self.enabled and aux is not None:
                found.append(aux)

        handles = [
            target.register_forward_pre_hook(ask, with_kwargs=True),
            target.register_forward_hook(keep, with_kwargs=True),
        ]
        try:
            yield found
        finally:
            for handle in handles:
                handle.remove()

    def add(
        self, loss: torch.Tensor, found: list[torch.Tensor], scale: float = 1.0, prefix: str = ""
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """(`loss` + coef × the mean aux loss of the collected passes × `scale`; the metric
        {prefix + "aux_loss": that unweighted mean, a detached 0-d tensor} to log). When the term is off:
        (`loss`, {})."""
        if not self.enabled:
            return loss, {}
        if not found:
            raise RuntimeError(
                "router_aux_loss_coef is on, but the model's forward returned no aux_loss; a custom forward "
                "must pass output_router_logits through to the model"
            )
        aux = torch.stack([a.float().reshape(()).to(loss.device) for a in found]).mean()
        return loss + self.coef * scale * aux, {f"{prefix}aux_loss": aux.detach()}


def attach_router_aux_loss(trainer, coef: float | None, owner: str) -> None:
    """Resolve the term for `trainer.model` into `trainer.router_aux`, with TRL 1.x's attribute names beside
    it (`aux_loss_enabled`, `router_aux_loss_coef`)."""
    trainer.router_aux = RouterAuxLoss.resolve(trainer.model, coef, owner)
    trainer.aux_loss_enabled = trainer.router_aux.enabled
    trainer.router_aux_loss_coef = trainer.router_aux.coef
