"""Multiplication with a calculator tool ("417*86" -> "35862"): a verifiable task for agents.

A tiny model cannot multiply 2-3 digit numbers in its head, but it can learn to call `multiply` with the
operands copied from the question and to repeat the tool's result: the task's skill is using the tool.
Each operand has 2 or 3 digits with equal chance, so products have 3 to 6 digits and an answer's length must
be read from the tool's result, not guessed. The train/test split is fixed by a hash of the *unordered* pair
(like `rlhfkit.tasks.addition`), so no held-out problem is a train problem with or without its operands
swapped; `seed` only picks which problems of a split are drawn.

Prompts are conversations (one user message); the reward is an exact match of the *final* assistant message
with the "answer" column, so a conversation's tool calls and results never count as the answer.
`CHAT_TEMPLATE` is the tiny tokenizer's chat format with tools, kept short for a tiny model: a one-line tool
list instead of full JSON schemas, compact JSON in Hermes-style `<tool_call>{json}</tool_call>` calls, and
tool results in a plain-text `<|tool|>` turn.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlhfkit.rewards.rules import completion_text

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

LOW, MIDDLE, HIGH = 10, 100, 999  # operands: [LOW, MIDDLE) or [MIDDLE, HIGH], half the draws each
TEST_FRACTION_DEN = 5  # about 1 unordered pair in 5 is held out
DEFAULT_SIZE = 4096  # problems in a split when no `n` is asked for
SPLITS = ("train", "test")


def multiply(a: int, b: int) -> int:
    """Multiply two integers exactly.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


# The tiny tokenizer's format (`<|role|>\n...<|endoftext|>\n`) with tools. The assistant turns sit in
# {% generation %} blocks, so SFT's assistant_only_loss trains on them and never on a tool result.
CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|system|>\ntools: ' }}"
    "{% for tool in tools %}{{ (tool.function or tool).name }}{{ ', ' if not loop.last }}{% endfor %}"
    "{{ '<|endoftext|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'assistant' %}{{ '<|assistant|>\n' }}{% generation %}"
    "{{ message.content or '' }}"
    "{% for call in message.tool_calls or [] %}{% set f = call.function or call %}"
    "{{ '<tool_call>' + {'name': f.name, 'arguments': f.arguments} | tojson(separators=(',', ':')) }}"
    "{{ '</tool_call>' }}"
    "{% endfor %}{{ '<|endoftext|>' }}{% endgeneration %}{{ '\n' }}"
    "{% elif message.role == 'tool' %}"
    "{{ '<|tool|>\n' + message.content | string + '<|endoftext|>\n' }}"
    "{% else %}{{ '<|' + message.role + '|>\n' + message.content + '<|endoftext|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def _in_test(a: int, b: int) -> bool:
    return zlib.crc32(f"{min(a, b)}*{max(a, b)}".encode("ascii")) % TEST_FRACTION_DEN == 0


def _operand(rng: random.Random) -> int:
    return rng.randint(LOW, MIDDLE - 1) if rng.random() < 0.5 else rng.randint(MIDDLE, HIGH)


def calculator_problems(split: str = "train", n: int | None = None, seed: int = 0) -> list[tuple[int, int]]:
    """`n` distinct (a, b) pairs of one split (DEFAULT_SIZE when None), drawn by `seed`.

    The split has about 785,000 ordered pairs, so pairs are drawn at random (each operand 2 or 3 digits
    with equal chance) and kept when they fall in the split, rather than listed and shuffled.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    n = DEFAULT_SIZE if n is None else n
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 100_000:
        raise ValueError(f"n must be an int in [1, 100000] or None, got {n!r}")
    rng = random.Random(f"calculator-{split}-{seed}")
    pairs: dict[tuple[int, int], None] = {}  # insertion-ordered set
    while len(pairs) < n:
        a, b = (_operand(rng) for _ in range(2))
        if _in_test(a, b) == (split == "test"):
            pairs[(a, b)] = None
    return list(pairs)


def question(a: int, b: int) -> str:
    return f"{a}*{b}"


def tool_call(a: int, b: int) -> dict[str, Any]:
    """The chat-template form of the call the task expects: `multiply(a=a, b=b)`."""
    return {"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}


def calculator_prompt_dataset(split: str = "train", n: int | None = None, seed: int = 0) -> Dataset:
    """Conversational prompts (one user message, "417*86") and their exact answers ("35862")."""
    from datasets import Dataset

    pairs = calculator_problems(split, n=n, seed=seed)
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": question(a, b)}] for a, b in pairs],
            "answer": [str(a * b) for a, b in pairs],
        }
    )


def transcript(a: int, b: int) -> list[dict[str, Any]]:
    """The conversation a good policy has: the question, a `multiply` call, its result, the answer."""
    return [
        {"role": "user", "content": question(a, b)},
        {"role": "assistant", "content": "", "tool_calls": [tool_call(a, b)]},
        {"role": "tool", "name": "multiply", "content": str(a * b)},
        {"role": "assistant", "content": str(a * b)},
    ]


def tool_schemas() -> list[dict[str, Any]]:
    from transformers.utils import get_json_schema

    return [get_json_schema(multiply)]


def calculator_sft_dataset(n: int | None = None, seed: int = 0, no_tool_share: float = 0.25) -> Dataset:
    """SFT transcripts on train problems: "messages" and "tools" (JSON) columns.

    A `no_tool_share` of the rows offers no tool and answers directly (the model's own arithmetic, what
    "accuracy without tools" measures); the others are `transcript`s with the `multiply` schema.
    """
    from datasets import Dataset

    if not 0.0 <= no_tool_share <= 1.0:
        raise ValueError(f"no_tool_share must be in [0, 1], got {no_tool_share!r}")
    pairs = calculator_problems("train", n=n, seed=seed)
    rng = random.Random(f"calculator-sft-{seed}")
    tools = json.dumps(tool_schemas())
    messages, tool_columns = [], []
    for a, b in pairs:
        direct = rng.random() < no_tool_share
        messages.append(
            [{"role": "user", "content": question(a, b)}, {"role": "assistant", "content": str(a * b)}]
            if direct
            else transcript(a, b)
        )
        tool_columns.append("[]" if direct else tools)
    return Dataset.from_dict({"messages": messages, "tools": tool_columns})


def calculator_reward(completions: list, answer: Sequence[str] | None = None, **columns: Any) -> list[float]:
    """1.0 when the final answer is exactly the row's `answer` (outer whitespace ignored), else 0.0."""
    if answer is None:
        raise ValueError("calculator_reward needs the dataset's 'answer' column (one answer per completion)")
    if len(answer) != len(completions):
        raise ValueError(f"'answer' has {len(answer)} rows for {len(completions)} completions")
    return [float(completion_text(c).strip() == str(ref)) for c, ref in zip(completions, answer)]
