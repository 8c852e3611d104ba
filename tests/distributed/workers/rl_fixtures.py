"""Builders shared by the RL workers and the one-process references in the tests (same seeds, same data)."""

from __future__ import annotations

import torch

from rlhfkit.rewards import KeywordReward
from rlhfkit.rollout import forward_response
from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_tokenizer, tiny_value_head_model

SGD_LR = 0.5


def sgd(policy, cfg: dict) -> tuple[dict, tuple]:
    """Plain SGD for a Trainer-based trainer: (config keywords, optimizers)."""
    if cfg.get("fsdp"):  # the Trainer refuses a ready-made optimizer under FSDP: the same SGD, built by it
        return {"optim": "sgd", "learning_rate": SGD_LR, **cfg}, (None, None)
    return cfg, (torch.optim.SGD(policy.parameters(), lr=SGD_LR), None)


def rloo_trainer(out: str, per_device: int, **kw):
    from rlhfkit.trainers.rloo.config import RLOOConfig
    from rlhfkit.trainers.rloo.trainer import RLOOTrainer

    cfg = dict(
        output_dir=out, report_to="none", use_cpu=True, per_device_train_batch_size=per_device, rloo_k=2,
        num_ppo_epochs=1, response_length=4, total_episodes=8, logging_steps=1, save_strategy="no",
        num_sample_generations=0, disable_tqdm=True, seed=3, max_grad_norm=0.0,
    )  # fmt: skip
    cfg.update(kw)
    policy = tiny_model("llama")
    cfg, optimizers = sgd(policy, cfg)
    return RLOOTrainer(
        RLOOConfig(**cfg),
        tiny_tokenizer(padding_side="left"),
        policy,
        tiny_model("llama"),
        KeywordReward("e"),
        toy_prompt_dataset(n=16),
        optimizers=optimizers,
    )


def synthetic_rloo_rollout(model, num_prompts: int = 2, k: int = 2, prompts: list[int] | None = None):
    """A fixed `RolloutBatch` of k completions for each of `num_prompts` prompts, in RLOO's row layout
    (completion j of prompt i in row i + j * num_prompts); `prompts` keeps only those prompts
    (one rank's share).
    """
    g = torch.Generator().manual_seed(7)
    query_ids = torch.randint(5, 200, (num_prompts, 3), generator=g)
    responses = torch.randint(5, 200, (k * num_prompts, 4), generator=g)
    advantages = torch.randn(k * num_prompts, generator=g)
    if prompts is not None:
        rows = torch.tensor([i + j * num_prompts for j in range(k) for i in prompts])
        query_ids, responses, advantages = query_ids[prompts], responses[rows], advantages[rows]
    n = query_ids.shape[0]
    query_ids = query_ids[torch.arange(k * n) % n]  # one query row per completion
    query_mask = torch.ones_like(query_ids, dtype=torch.bool)
    response_mask = torch.ones_like(responses, dtype=torch.bool)
    with torch.no_grad():  # old logprobs = current ones: ratio 1, nothing clipped
        old = forward_response(model, query_ids, query_mask, responses, response_mask).logprobs
    return RolloutBatch(query_ids, query_mask, responses, response_mask, response_mask, logprobs=old,
                        advantages=advantages, scores=advantages.clone())  # fmt: skip


def flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def ppo_trainer(batch_size: int, adam: bool = False, **config_kw):
    """PPOTrainer with plain SGD (updates are linear in the gradient, so rank averaging is visible exactly),
    or with `adam` (an optimizer with state, for checkpoints)."""

    from rlhfkit import PPOConfig, PPOTrainer

    torch.manual_seed(0)  # the value head is initialised at random: the same on every process
    model = tiny_value_head_model("llama", summary_dropout_prob=0.0)
    config = PPOConfig(
        batch_size=batch_size,
        mini_batch_size=batch_size,
        ppo_epochs=1,
        seed=7,
        learning_rate=1.0,
        **config_kw,
    )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=1e-2) if adam else torch.optim.SGD(params, lr=SGD_LR)
    return PPOTrainer(config, model, tokenizer=tiny_tokenizer(padding_side="left"), optimizer=optimizer)


def ppo_rank_rollout(rank: int):
    """Rank `rank`'s own (queries, responses, scores) of 2 samples, as each rank samples its own rollout."""
    g = torch.Generator().manual_seed(100 + rank)
    queries = [torch.randint(5, 200, (3,), generator=g) for _ in range(2)]
    responses = [torch.randint(5, 200, (4,), generator=g) for _ in range(2)]
    return queries, responses, [torch.tensor(10.0 * rank + 1.0), torch.tensor(10.0 * rank + 2.0)]


def fixed_ppo_batch(trainer, rows: list[int]):
    """Rows of a fixed 4-sample rollout (equal lengths, so every rank trains on as many tokens), as a
    `RolloutBatch` with old logprobs, values, advantages and returns filled: ready for `trainer._update`."""
    from rlhfkit.rollout.batch import RolloutBatch

    g = torch.Generator().manual_seed(11)
    queries = torch.randint(5, 200, (4, 3), generator=g)
    responses = torch.randint(5, 200, (4, 4), generator=g)
    advantages, returns = torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g)
    batch = RolloutBatch.from_sequences([queries[i] for i in rows], [responses[i] for i in rows], 0)
    out = trainer._forward_batch(trainer.policy, batch, with_values=True)
    return batch.replace(
        logprobs=out.logprobs, values=out.values, advantages=advantages[rows], returns=returns[rows]
    )


def flat_trainable(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters() if p.requires_grad])
