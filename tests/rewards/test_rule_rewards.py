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


# ---------------------------------------------------------------- conversations with tool messages
# What a tool-calling completion is: the model's call turn, the tool's result, the model's answer.
def tool_conversation(call_text, result, answer):
    call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": 6, "b": 7}}}
    return [
        {"role": "assistant", "content": call_text, "tool_calls": [call]},
        {"role": "tool", "name": "multiply", "content": result},
        {"role": "assistant", "content": answer},
    ]


def test_completion_text_of_a_conversation_is_its_final_assistant_message():
    assert rewards.completion_text(tool_conversation("Let me see.", "42", "It is 42")) == "It is 42"
    # ended on the tool's result (capped): the last assistant turn is the call, whose text is empty
    assert rewards.completion_text(tool_conversation(None, "42", "x")[:2]) == ""
    assert rewards.completion_text([{"role": "tool", "content": "42"}]) == ""  # no assistant turn: no answer
    assert rewards.completion_text([]) == ""
    # a message without a role is the model's (TRL's `[{"content": ...}]` completions)
    assert rewards.completion_text([{"content": "a"}, {"role": "tool", "content": "b"}]) == "a"
    final = {"role": "assistant", "content": [{"type": "text", "text": "4"}, {"type": "text", "text": "2"}]}
    assert rewards.completion_text([*tool_conversation("", "42", "")[:2], final]) == "42"


def test_accuracy_scores_the_answer_never_the_tool_result():
    completions = [
        tool_conversation("", "42", "\\boxed{42}"),  # answered 42: right
        tool_conversation("", "42", "41"),  # the tool said 42, the model answered 41: wrong
        tool_conversation("", "42", "42")[:2],  # ended on the tool's result: no answer, wrong
        tool_conversation("\\boxed{42}", "42", "I am not sure"),  # an earlier turn's answer does not count
    ]
    # joining every message would have scored rows 2 and 3 as right ("42" alone, "\\boxed{42}" last boxed)
    assert rewards.accuracy_reward(completions, solution=["42"] * 4) == [1.0, 0.0, 0.0, 0.0]
    assert rewards.exact_match_reward("answer")(completions, answer=["#### 42"] * 4) == [1.0, 0.0, 0.0, 0.0]


def test_format_keyword_and_length_rewards_read_the_final_assistant_message():
    think = tool_conversation(
        "<think>call</think>", "<answer>42</answer>", "<think>ok</think><answer>42</answer>"
    )
    bare = tool_conversation("<think>call</think>", "<think>a</think><answer>42</answer>", "42")
    assert rewards.format_reward()([think, bare]) == [1.0, 0.0]
    # "good" twice in the tool's result and once in the answer: 1, not 3
    keyword = rewards.KeywordReward("good", cap=5)
    assert keyword([tool_conversation("good", "good good", "a good one")]) == [1.0]
    # target 2 words: the answer "six sevens" has 2 (1.0); all the messages together have 5 (-0.5)
    assert rewards.LengthReward(2)([tool_conversation("I will", "42", "six sevens")]) == [1.0]


def test_character_lengths_count_every_message_of_a_conversation():
    # without completion_ids a length is the completion's size (which max_completion_length bounds):
    # 3 + 2 + 5 = 10 characters, 7 past the target of 3
    reward = rewards.length_penalty(target_length=3, coef=0.5)
    assert reward([tool_conversation("abc", "42", "abcde")]) == [-3.5]


def test_sentiment_reads_the_final_assistant_message():
    pytest.importorskip("vaderSentiment")
    judge = rewards.SentimentJudge()
    # a glowing tool result around a neutral answer scores as the neutral answer alone (VADER: 0.0)
    glowing = tool_conversation("", "What a wonderful, brilliant, lovely film!", "The film is 90 minutes.")
    assert judge([glowing]) == judge(["The film is 90 minutes."]) == [0.0]
