"""Builders shared by the GRPO worker and the one-process reference in the test (same seeds, same data)."""

from __future__ import annotations

import torch

from rlhfkit.rewards import KeywordReward
from rlhfkit.rollout import forward_response
from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_tokenizer

from .rl_fixtures import sgd

LOSS_TYPES = ("dapo", "grpo", "dr_grpo")


def count_e(completions, **columns):
    return KeywordReward("e")(completions)


def grpo_trainer(out: str, per_device: int, **kw):
    """GRPOTrainer with plain SGD (updates are linear in the gradient, so a wrong normaliser shows
    exactly)."""
    from rlhfkit.trainers.grpo.config import GRPOConfig
    from rlhfkit.trainers.grpo.trainer import GRPOTrainer

    cfg = dict(
        output_dir=out, report_to="none", use_cpu=True, per_device_train_batch_size=per_device,
        gradient_accumulation_steps=2, num_generations=2, max_completion_length=4, max_steps=2,
        logging_steps=1, save_strategy="no", disable_tqdm=True, seed=3, max_grad_norm=0.0,
    )  # fmt: skip
    cfg.update(kw)
    policy = tiny_model("llama")
    cfg, optimizers = sgd(policy, cfg)
    return GRPOTrainer(
        policy,
        count_e,
        args=GRPOConfig(**cfg),
        train_dataset=toy_prompt_dataset(n=16),
        processing_class=tiny_tokenizer(padding_side="left"),
        optimizers=optimizers,
    )


def synthetic_grpo_rollout(model, rows: slice = slice(None)) -> RolloutBatch:
    """8 fixed completions of uneven lengths (so token-normalised losses depend on the whole step's count),
    with sampling and reference logprobs and advantages; `rows` keeps one rank's share."""
    g = torch.Generator().manual_seed(11)
    query_ids = torch.randint(5, 200, (8, 3), generator=g)
    responses = torch.randint(5, 200, (8, 5), generator=g)
    lengths = torch.tensor([5, 1, 3, 2, 4, 5, 2, 1])
    response_mask = torch.arange(5)[None] < lengths[:, None]
    advantages = torch.randn(8, generator=g)
    query_ids, responses, response_mask, advantages = (
        query_ids[rows],
        responses[rows],
        response_mask[rows],
        advantages[rows],
    )
    query_mask = torch.ones_like(query_ids, dtype=torch.bool)
    with torch.no_grad():
        old = forward_response(model, query_ids, query_mask, responses, response_mask).logprobs
    ref = old - 0.1 * torch.arange(old.shape[1])[None]
    return RolloutBatch(query_ids, query_mask, responses, response_mask, response_mask, logprobs=old,
                        ref_logprobs=ref, advantages=advantages, scores=advantages.clone())  # fmt: skip


def flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])
