"""The small pieces of GRPO's multi-turn setup and sampling, on hand-made inputs: the environment pool, a
reset's text added to the prompt, `get_reward` as a reward function (sync and async), rollout_func's output
checks, the batch built from token lists, and the completions table's text of a conversation."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlhfkit.trainers.grpo.agent_sampling import (
    check_prompt_lengths,
    check_rollout_output,
    conversation_text,
    sequences_batch,
    with_observation,
)
from rlhfkit.trainers.grpo.agent_setup import (
    EnvironmentPool,
    environment_methods,
    environment_reward,
    setup_agents,
    with_environment_rewards,
)


class Box:
    made = 0

    def __init__(self):
        Box.made += 1
        self.value = 0

    def reset(self, **row):
        self.value = row.get("value", 0)

    def get_reward(self) -> float:
        return float(self.value)

    def put(self, value: int) -> str:
        """Put a value in the box.

        Args:
            value: what to put.
        """
        self.value = value
        return "ok"

    def _hidden(self) -> None:
        pass

    @property
    def costly(self):
        raise AssertionError("properties are not read")


class AsyncBox(Box):
    async def get_reward(self) -> float:
        await asyncio.sleep(0)
        return -1.0


def test_the_pool_makes_instances_once_and_hands_each_rollout_its_own():
    Box.made = 0
    pool = EnvironmentPool({"a": Box, "b": Box})
    first = pool.take(["a", "a", "b"])
    assert Box.made == 3 and len({id(e) for e in first}) == 3
    second = pool.take(["a", "b", "a", "a"])  # one more "a" than before: one more made, the others reused
    assert Box.made == 4
    assert [id(e) for e in second[:3]] == [id(first[0]), id(first[2]), id(first[1])]


def test_environment_methods_are_public_non_reserved_and_bound():
    box = Box()
    methods = environment_methods(box)
    assert [m.__name__ for m in methods] == ["put"] and methods[0].__self__ is box


def test_get_reward_scores_only_its_own_class_and_may_be_async():
    boxes = [Box(), AsyncBox(), Box()]
    boxes[0].value, boxes[2].value = 2, 5
    sync = environment_reward(Box)
    assert sync.__name__ == "Box" and sync(environments=boxes) == [2.0, None, 5.0]  # exact type only
    async_reward = environment_reward(AsyncBox)
    assert async_reward.__name__ == "AsyncBox"
    assert asyncio.run(async_reward(environments=boxes)) == [None, -1.0, None]


def test_environment_rewards_join_the_reward_functions():
    agents = setup_agents(None, None, {"a": Box, "b": AsyncBox}, "T")
    assert [r.__name__ for r in agents.rewards] == ["Box", "AsyncBox"]
    funcs, classes = with_environment_rewards(len, "tok", agents)
    assert funcs[0] is len and [f.__name__ for f in funcs[1:]] == ["Box", "AsyncBox"]
    assert classes == ["tok", None, None]
    assert with_environment_rewards(None, None, agents)[0] == agents.rewards  # the environment owns it


def test_reset_text_is_appended_to_the_last_message_of_a_copy():
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "Play."}]
    assert with_observation(prompt, " Board: x.")[1] == {"role": "user", "content": "Play. Board: x."}
    assert prompt[1]["content"] == "Play."  # the dataset's row is left alone
    assert with_observation(prompt, None) is prompt
    blocks = [{"role": "user", "content": [{"type": "text", "text": "Play."}]}]
    assert with_observation(blocks, "x")[0]["content"][1] == {"type": "text", "text": "x"}
    with pytest.raises(TypeError, match="reset returned int"):
        with_observation(prompt, 3)


@pytest.mark.parametrize(
    "output, error",
    [
        ([1], "must return a dict, got list"),
        ({"prompt_ids": [[1]], "completion_ids": [[2]]}, "lacks logprobs"),
        (
            {"prompt_ids": [[1]], "completion_ids": [[2]], "logprobs": [[0.0]], "x": [1, 2]},
            "'x' must be a list",
        ),
        ({"prompt_ids": [[1]], "completion_ids": [[2, 3]], "logprobs": [[0.0]]}, "'logprobs' row 0 has 1"),
        (
            {"prompt_ids": [[1]], "completion_ids": [[2]], "logprobs": [[0.0]], "env_mask": [[1, 0]]},
            "'env_mask' row 0 has 2 entries for 1",
        ),
    ],
)
def test_rollout_func_output_errors_say_what_is_missing(output, error):
    with pytest.raises((TypeError, ValueError), match=error):
        check_rollout_output(output, 1)


def test_sequences_batch_pads_and_masks_inserted_tokens():
    batch = sequences_batch(
        [[5, 6], [7]], [[1, 2, 3], [4]], [[-0.1, -0.2, -0.3], [-0.4]], [[True, False, True], [True]], 0, "cpu"
    )
    assert batch.query_ids.tolist() == [[5, 6], [0, 7]] and batch.query_mask.tolist() == [[1, 1], [0, 1]]
    assert batch.responses.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert batch.loss_mask.tolist() == [[True, False, True], [True, False, False]]
    assert batch.model_tokens().sum(1).tolist() == [2, 1] and batch.response_mask.sum(1).tolist() == [3, 1]
    torch.testing.assert_close(batch.logprobs, torch.tensor([[-0.1, 0.0, -0.3], [-0.4, 0.0, 0.0]]))
    plain = sequences_batch([[5]], [[1, 2]], [[-1.0, -2.0]], None, 0, "cpu")
    assert plain.model_mask is None and plain.loss_mask.tolist() == [[True, True]]


def test_conversation_text_shows_calls_and_results():
    messages = [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "put", "arguments": {"value": 3}}}
        ]},
        {"role": "tool", "name": "put", "content": "ok"},
        {"role": "assistant", "content": "Done."},
    ]  # fmt: skip
    assert conversation_text(messages) == '[assistant] put({"value": 3})\n[tool put] ok\n[assistant] Done.'


def test_a_tool_prompt_longer_than_max_prompt_length_is_refused_not_cut():
    check_prompt_lengths([[1] * 5, [1] * 3], 5, "T")
    check_prompt_lengths([[1] * 9], None, "T")
    with pytest.raises(ValueError, match="has 6 tokens, more than max_prompt_length=5.*drop the tools"):
        check_prompt_lengths([[1] * 5, [1] * 6], 5, "T")


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("max_tool_calling_iterations", -1, "max_tool_calling_iterations must be an integer >= 0 or None"),
        ("max_tool_calling_iterations", 1.5, "max_tool_calling_iterations must be int or None, got float"),
        ("tool_timeout", 0, r"tool_timeout must be > 0 \(seconds\), got 0"),
    ],
)
def test_tool_fields_are_checked_on_both_configs(tmp_path, field, value, error):
    from rlhfkit.trainers.grpo.config import GRPOConfig
    from rlhfkit.trainers.rloo.config import RLOOConfig

    for config_class in (GRPOConfig, RLOOConfig):  # RLOO: a tool field picks the current form, checked
        with pytest.raises((TypeError, ValueError), match=error):
            config_class(output_dir=str(tmp_path), use_cpu=True, **{field: value})
