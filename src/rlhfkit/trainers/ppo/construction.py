"""The pieces `PPOTrainer.__init__` assembles: the Accelerator, the default optimizer, the KL controller,
the prompt DataLoader and the trackers, with the checks that must fail before any of them is used.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from rlhfkit.core.kl import AdaptiveKLController, FixedKLController
from rlhfkit.trainers.common.optimizers import fused_optimizer_kwargs
from rlhfkit.trainers.ppo import stats as ppo_stats
from rlhfkit.trainers.ppo.config import PPOConfig
from rlhfkit.trainers.ppo.inputs import ppo_collator

logger = logging.getLogger(__name__)

# the dataset columns `prepare_dataloader` keeps: the value-head forward takes input_ids/attention_mask,
# the text columns stay for logging
KEPT_COLUMNS = {"input_ids", "attention_mask", "query", "response", "label", "labels", "prompt"}


def project_kwargs(config: PPOConfig) -> dict[str, Any]:
    """`config.project_kwargs`, with a folder for the tracker logs when a tracker is on and none is named."""
    kwargs = dict(config.project_kwargs)
    if config.log_with is not None and "logging_dir" not in kwargs and "project_dir" not in kwargs:
        kwargs["project_dir"] = "runs"  # TensorBoard needs a folder; say where it went
        logger.info("PPOTrainer: tracker logs go to ./runs (set project_kwargs={'logging_dir': ...})")
    return kwargs


def make_accelerator(config: PPOConfig) -> Any:
    """The run's Accelerator; also derives the config's per-process batch sizes and seeds every RNG."""
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed

    accelerator = Accelerator(
        log_with=config.log_with,
        project_config=ProjectConfiguration(**project_kwargs(config)),
        **config.accelerator_kwargs,
    )
    config._derive_sizes(accelerator.num_processes)
    set_seed(config.seed, device_specific=True)
    return accelerator


def uses_fsdp(accelerator: Any) -> bool:
    """Whether the run shards the policy with FSDP.

    FSDP1 is refused: generation and the rollout forwards need FSDP2's modules.
    """
    from accelerate.utils import DistributedType

    fsdp = accelerator.distributed_type == DistributedType.FSDP
    if fsdp and not accelerator.is_fsdp2:
        raise ValueError("PPOTrainer under FSDP needs FSDP2: set fsdp_version: 2 in the accelerate config")
    return fsdp


def default_optimizer(model: nn.Module, learning_rate: float) -> torch.optim.Optimizer:
    """Adam over the model's trainable parameters (fused where the device supports it)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("the model has no trainable parameters (requires_grad=True)")
    return torch.optim.Adam(trainable, lr=learning_rate, **fused_optimizer_kwargs(trainable))


def kl_controller(config: PPOConfig) -> AdaptiveKLController | FixedKLController:
    """The adaptive KL controller of `config.adap_kl_ctrl`, else a fixed coefficient."""
    if config.adap_kl_ctrl:
        return AdaptiveKLController(config.init_kl_coef, config.target, config.horizon)
    return FixedKLController(config.init_kl_coef)


def prompt_dataloader(dataset: Any, config: PPOConfig, data_collator: Any) -> torch.utils.data.DataLoader:
    """A shuffled DataLoader of `config.local_batch_size` prompts per batch.

    The last incomplete batch is dropped; with `config.remove_unused_columns`, a `datasets.Dataset` keeps
    only `KEPT_COLUMNS`.
    """
    import datasets

    if isinstance(dataset, datasets.Dataset) and config.remove_unused_columns:
        dataset = dataset.remove_columns([c for c in dataset.column_names if c not in KEPT_COLUMNS])
    collate = data_collator if data_collator is not None else ppo_collator
    return torch.utils.data.DataLoader(
        dataset, batch_size=config.local_batch_size, collate_fn=collate, shuffle=True, drop_last=True
    )


def start_trackers(accelerator: Any, config: PPOConfig) -> None:
    """Open the `config.log_with` trackers with the flattened config as hyperparameters (no-op without)."""
    if config.log_with is not None:
        accelerator.init_trackers(
            config.tracker_project_name,
            config=ppo_stats.flat_hparams(config.to_dict()),
            init_kwargs=config.tracker_kwargs,
        )
