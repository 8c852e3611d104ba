"""Rule-based reward functions: plain and conversational completions, None rows, lengths."""

import pytest

from rlhfkit import rewards


def chat(text):
    return [{"role": "assistant", "content": text}]


def test_completion_text_handles_strings_and_conversations():
    assert rewards.completion_text("abc") == "abc"
    assert rewards.completion_text(chat("abc")) == "abc"
    assert (
        rewards.completion_text([{"role": "assistant", "content": [{"type": "text", "text": "ab"}]}]) == "ab"
    )


def test_accuracy_extracts_the_final_answer_and_collapses_whitespace():
    completions = [
        "so  the answer is \\boxed{ 42 }",
        "#### 41",
        " 1 2\n3 ",
        chat("\\boxed{7} then \\boxed{8}"),
    ]
    solutions = ["42", "The sum is 42.\n#### 42", "1 2 3", "8"]
    # boxed 42 == 42; 41 != 42 (the reference's #### part is extracted too); whitespace runs collapse;
    # the last boxed answer counts
    assert rewards.accuracy_reward(completions, solution=solutions) == [1.0, 0.0, 1.0, 1.0]
    assert rewards.accuracy_reward.__name__ == "accuracy_reward"


def test_accuracy_is_none_where_there_is_no_reference():
    assert rewards.accuracy_reward(["1", "2"], solution=[None, 2]) == [None, 1.0]
    assert rewards.accuracy_reward(["1", "2"], answer=["1", "2"]) == [None, None]  # no `solution` column


def test_exact_match_reads_another_column():
    reward = rewards.exact_match_reward("answer")
    assert reward(["1", "2"], answer=["1", "3"]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="column 'answer' has 1 rows for 2"):
        reward(["1", "2"], answer=["1"])


def test_format_reward_needs_a_full_match():
    reward = rewards.format_reward()
    completions = [
        "<think>a\nb</think> <answer>3</answer>\n",
        "<think>a</think>",
        "x <think>a</think><answer>3</answer>",
    ]
    assert reward(completions) == [1.0, 0.0, 0.0]
    assert rewards.format_reward(r"\d+")([chat("123"), chat("12a")]) == [1.0, 0.0]


def test_length_penalty_counts_tokens_when_given_else_characters():
    reward = rewards.length_penalty(target_length=3, coef=0.5)
    # characters: 2 -> 0, 5 -> -(5 - 3) * 0.5
    assert reward(["ab", "abcde"]) == [0.0, -1.0]
    # tokens win over characters
    assert reward(["ab", "abcde"], completion_ids=[[1, 2, 3, 4], [1]]) == [-0.5, 0.0]
    with pytest.raises(ValueError, match="coef"):
        rewards.length_penalty(3, coef=-1)


def test_soft_overlong_penalty_is_dapo_eq_13():
    # L_max 10, buffer 4: free up to 6, then (6 - L) / 4 down to -1 at 10, -1 beyond
    reward = rewards.soft_overlong_penalty(max_completion_length=10, overlong_buffer=4)
    ids = [[0] * n for n in (3, 6, 7, 8, 10, 12)]
    assert reward(["x"] * 6, completion_ids=ids) == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    assert reward([chat("x" * 8)]) == [-0.5]  # characters without completion_ids
    with pytest.raises(ValueError, match="overlong_buffer"):
        rewards.soft_overlong_penalty(10, 0)
    with pytest.raises(ValueError, match="max_completion_length"):
        rewards.soft_overlong_penalty(0, 1)
