"""Async reward functions (TRL 1.x): awaited, run concurrently with each other, mixed with plain functions,
None rows kept apart, from inside a running event loop too, and through GRPOTrainer and RLOOTrainer."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlhfkit import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer
from rlhfkit.rewards.scoring import RewardScorer, await_all
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_tokenizer

COMPLETIONS = ["a cat", "the end", "eee", ""]


async def count_e(completions, **kwargs):
    await asyncio.sleep(0)
    return [float(c.count("e")) for c in completions]


async def only_long(completions, **kwargs):
    return [float(len(c)) if len(c) > 4 else None for c in completions]


def length(completions, **kwargs):
    return [float(len(c)) for c in completions]


def _score(*sources, weights=None):
    scorer = RewardScorer(list(sources), tiny_tokenizer(), reward_weights=weights)
    return scorer.score_texts(["p"] * len(COMPLETIONS), COMPLETIONS)


def test_async_functions_are_awaited_and_mixed_with_plain_ones():
    scores, per_source = _score(count_e, length, weights=[1.0, 0.5])
    assert per_source[0].tolist() == [0.0, 2.0, 3.0, 0.0]
    torch.testing.assert_close(scores, torch.tensor([2.5, 5.5, 4.5, 0.0]))  # e + len / 2


def test_an_async_none_leaves_the_row_to_the_other_functions():
    result = _score(only_long, length)
    assert result.applies[0].tolist() == [True, True, False, False]
    assert result[0].tolist() == [10.0, 14.0, 3.0, 0.0]  # (scores, per_source)


def test_async_functions_run_concurrently():
    # each waits for the other's signal: run one after the other, the first would time out
    first, second = asyncio.Event(), asyncio.Event()

    async def a(completions, **kwargs):
        first.set()
        await asyncio.wait_for(second.wait(), timeout=5)
        return [1.0] * len(completions)

    async def b(completions, **kwargs):
        second.set()
        await asyncio.wait_for(first.wait(), timeout=5)
        return [2.0] * len(completions)

    scores, _ = _score(a, b)
    assert scores.tolist() == [3.0] * len(COMPLETIONS)


def test_inside_a_running_event_loop():
    async def caller():  # a notebook's loop: the functions get a worker thread's own loop
        return await_all([asyncio.sleep(0, result=1), asyncio.sleep(0, result=2)])

    assert asyncio.run(caller()) == [1, 2]


@pytest.mark.parametrize("trainer", ["grpo", "rloo"])
def test_trainers_train_on_an_async_reward(tmp_path, trainer):
    config_class, trainer_class = (
        (GRPOConfig, GRPOTrainer) if trainer == "grpo" else (RLOOConfig, RLOOTrainer)
    )
    args = config_class(
        output_dir=str(tmp_path), report_to="none", per_device_train_batch_size=8, num_generations=4,
        max_completion_length=5, max_steps=2, logging_steps=1, save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    model = trainer_class(model=tiny_model("llama"), reward_funcs=[count_e, length], args=args,
                          train_dataset=toy_prompt_dataset(n=16),
                          processing_class=tiny_tokenizer(padding_side="left"))  # fmt: skip
    model.train()
    logged = [h for h in model.state.log_history if "rewards/count_e/mean" in h]
    assert len(logged) == 2 and all(h["rewards/count_e/mean"] >= 0 for h in logged)
