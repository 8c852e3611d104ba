"""The calculator task: problems and split, the exact reward, transcripts and their chat rendering."""

from __future__ import annotations

import json

import pytest

from rlhfkit.tasks import calculator as calc
from rlhfkit.tasks import get_task


def test_multiply_and_its_schema():
    assert calc.multiply(417, 86) == 35862
    (schema,) = calc.tool_schemas()
    function = schema["function"]
    assert function["name"] == "multiply" and function["parameters"]["required"] == ["a", "b"]
    assert {p["type"] for p in function["parameters"]["properties"].values()} == {"integer"}


def test_problems_are_distinct_seeded_and_split_by_unordered_pair():
    train = calc.calculator_problems("train", n=3000, seed=0)
    test = calc.calculator_problems("test", n=3000, seed=0)
    assert len(set(train)) == 3000 and len(set(test)) == 3000
    assert all(calc.LOW <= x <= calc.HIGH for pair in train + test for x in pair)
    unordered = {frozenset(pair) for pair in train}
    assert not unordered & {frozenset(pair) for pair in test}  # nor with the operands swapped
    assert calc.calculator_problems("train", n=3000, seed=0) == train  # deterministic
    assert calc.calculator_problems("train", n=50, seed=1) != train[:50]
    assert calc.calculator_problems("train", n=50, seed=0) == train[:50]  # n only cuts the same draw
    assert len(calc.calculator_problems("test")) == calc.DEFAULT_SIZE
    two_digit = sum(x < calc.MIDDLE for pair in train for x in pair) / (2 * len(train))
    assert 0.45 < two_digit < 0.55  # each operand 2 or 3 digits with equal chance


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split": "valid"}, "split must be 'train' or 'test', got 'valid'"),
        ({"n": 0}, r"n must be an int in \[1, 100000\] or None, got 0"),
        ({"n": 2.5}, "got 2.5"),
    ],
)
def test_bad_problem_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        calc.calculator_problems(**kwargs)


def test_prompt_dataset_carries_exact_products():
    data = calc.calculator_prompt_dataset("test", n=20, seed=3)
    for prompt, answer in zip(data["prompt"], data["answer"]):
        (message,) = prompt
        a, b = map(int, message["content"].split("*"))
        assert message["role"] == "user" and answer == str(a * b)


def test_reward_reads_the_final_assistant_message_only():
    conversation = calc.transcript(417, 86)[1:]  # what the policy adds: call, result, answer
    wrong_final = [*conversation[:-1], {"role": "assistant", "content": "35863"}]
    no_answer = conversation[:-1]  # the tool's result alone is not an answer
    completions = ["35862", " 35862\n", "3586", conversation, wrong_final, no_answer]
    scores = calc.calculator_reward(completions, answer=["35862"] * 6)
    assert scores == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]


def test_reward_without_its_column_names_it():
    with pytest.raises(ValueError, match="needs the dataset's 'answer' column"):
        calc.calculator_reward(["1"])
    with pytest.raises(ValueError, match="'answer' has 2 rows for 1 completions"):
        calc.calculator_reward(["1"], answer=["1", "2"])


def _tokenizer():
    from rlhfkit.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = calc.CHAT_TEMPLATE
    return tokenizer


def test_template_renders_a_transcript_exactly():
    text = _tokenizer().apply_chat_template(
        calc.transcript(417, 86), tools=calc.tool_schemas(), tokenize=False
    )
    assert text == (
        "<|system|>\ntools: multiply<|endoftext|>\n<|user|>\n417*86<|endoftext|>\n<|assistant|>\n"
        '<tool_call>{"name":"multiply","arguments":{"a":417,"b":86}}</tool_call><|endoftext|>\n'
        "<|tool|>\n35862<|endoftext|>\n<|assistant|>\n35862<|endoftext|>\n"
    )
    no_tools = _tokenizer().apply_chat_template(
        [{"role": "user", "content": "12*34"}], tokenize=False, add_generation_prompt=True
    )
    assert no_tools == "<|user|>\n12*34<|endoftext|>\n<|assistant|>\n"


def test_assistant_mask_covers_the_call_and_the_answer_never_the_result():
    tokenizer = _tokenizer()
    out = tokenizer.apply_chat_template(
        calc.transcript(417, 86),
        tools=calc.tool_schemas(),
        return_assistant_tokens_mask=True,
        return_dict=True,
    )
    trained = [i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert tokenizer.decode(trained) == (
        '<tool_call>{"name":"multiply","arguments":{"a":417,"b":86}}</tool_call><|endoftext|>'
        "35862<|endoftext|>"
    )


def test_sft_dataset_mixes_direct_answers_and_tool_transcripts():
    data = calc.calculator_sft_dataset(n=400, seed=0)
    direct = [json.loads(tools) == [] for tools in data["tools"]]
    assert 0.15 < sum(direct) / len(direct) < 0.35  # no_tool_share=0.25, drawn per row
    for messages, is_direct, tools in zip(data["messages"], direct, data["tools"]):
        a, b = map(int, messages[0]["content"].split("*"))
        assert messages[-1] == {**messages[-1], "role": "assistant", "content": str(a * b)}
        if is_direct:
            assert len(messages) == 2
        else:
            call = messages[1]["tool_calls"][0]["function"]
            assert call == {"name": "multiply", "arguments": {"a": a, "b": b}}
            assert json.loads(tools) == calc.tool_schemas()
    assert all(json.loads(t) for t in calc.calculator_sft_dataset(n=20, no_tool_share=0.0)["tools"])
    with pytest.raises(ValueError, match=r"no_tool_share must be in \[0, 1\], got 1.5"):
        calc.calculator_sft_dataset(n=4, no_tool_share=1.5)


def test_registry_task_carries_tools_and_template():
    task = get_task("calculator")
    assert task.tools == (calc.multiply,) and task.chat_template == calc.CHAT_TEMPLATE
    assert task.reward_columns == ("answer",)
    assert task.reward([[{"role": "assistant", "content": "6"}]], answer=["6"]) == [1.0]


def test_transcript_turns_parse_back_to_the_tool_call_and_answer():
    from rlhfkit.agents import check_prefix_preserving, parse_turn, tool_suffix_ids

    tokenizer = _tokenizer()
    check_prefix_preserving(tokenizer)  # results can be appended token by token
    out = tokenizer.apply_chat_template(
        calc.transcript(417, 86),
        tools=calc.tool_schemas(),
        return_assistant_tokens_mask=True,
        return_dict=True,
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    starts = [i for i in range(len(ids)) if mask[i] and not (i and mask[i - 1])]
    ends = [i + 1 for i in range(len(ids)) if mask[i] and not (i + 1 < len(ids) and mask[i + 1])]
    call_turn, answer_turn = (ids[s:e] for s, e in zip(starts, ends))
    parsed = parse_turn(tokenizer, call_turn, [], calc.tool_schemas())
    assert parsed.tool_calls == [calc.tool_call(417, 86)] and parsed.malformed == 0 and parsed.content == ""
    final = parse_turn(tokenizer, answer_turn, [], calc.tool_schemas())
    assert (final.content, final.tool_calls) == ("35862", [])
    # what the rollout inserts after the call turn is exactly the template's text between the two turns
    suffix = tool_suffix_ids(tokenizer, [{"role": "tool", "name": "multiply", "content": "35862"}])
    assert ids[ends[0] : starts[1]] == suffix
    assert tokenizer.decode(suffix) == "\n<|tool|>\n35862<|endoftext|>\n<|assistant|>\n"
