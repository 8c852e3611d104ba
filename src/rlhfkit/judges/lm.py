"""A local causal LM as a pairwise judge: which answer is better, read from the logprobs of the choice tokens.

The judge prompt shows the two answers under labels and asks for the label of the better one; one forward
pass gives the logprobs of the two choice tokens at the next position, and their difference is the margin
for the first answer. Each pair is judged twice, in both orders: a win needs both orders to agree, so a
judge that prefers a position (always "A") gives ties, not wins. No sampling: the verdict is deterministic.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from rlhfkit.judges.base import TIE, BasePairwiseJudge, check_pairs
from rlhfkit.models.eval_mode import eval_mode
from rlhfkit.rollout.generation import pad_left
from rlhfkit.rollout.scoring import forward_response

DEFAULT_TEMPLATE = (
    "Two answers to the same prompt follow. Which one is better: more helpful, accurate and fluent?\n\n"
    "Prompt:\n{prompt}\n\nAnswer A:\n{first}\n\nAnswer B:\n{second}\n\n"
    "Reply with the letter of the better answer only, A or B.\n"
)
TEMPLATE_FIELDS = {"prompt", "first", "second"}


def _check_template(template: str) -> None:
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as err:
        raise ValueError(f"template is not a valid format string: {err}") from err
    if names != TEMPLATE_FIELDS:
        raise ValueError(
            f"template must use exactly the fields {{prompt}}, {{first}} and {{second}}, got {sorted(names)}"
        )


def choice_token_ids(tokenizer: Any, choices: Sequence[str]) -> tuple[int, int]:
    """The token ids of the two choice strings; each must be exactly one token, and they must differ."""
    if isinstance(choices, str) or len(choices) != 2:
        raise ValueError(
            f"choices must be two strings (labels of the first and second answer), got {choices!r}"
        )
    ids = []
    for choice in choices:
        encoded = tokenizer.encode(choice, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(f"choices: {choice!r} is {len(encoded)} tokens here; each must be one token")
        ids.append(encoded[0])
    if ids[0] == ids[1]:
        raise ValueError(f"choices {choices!r} map to the same token {ids[0]}")
    return ids[0], ids[1]


class LMPairwiseJudge(BasePairwiseJudge):
    """Asks a local causal LM which of two answers is better; both orders, disagreement is a tie.

    `template` has the fields {prompt}, {first} and {second} and should end where the model is to write the
    label; `choices` are the labels of the first and second answer, one token each ("A"/"B", or "0"/"1"
    with a template to match). With `use_chat_template` (default: when the tokenizer has one) the filled
    template is sent as a user message with the generation prompt added. `margin`: how much larger, in
    nats, one choice's logprob must be for an order to count as a preference.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        template: str = DEFAULT_TEMPLATE,
        choices: Sequence[str] = ("A", "B"),
        use_chat_template: bool | None = None,
        batch_size: int = 8,
        margin: float = 0.0,
    ):
        _check_template(template)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if not margin >= 0:
            raise ValueError(f"margin must be >= 0, got {margin!r}")
        self.choice_ids = choice_token_ids(tokenizer, choices)
        if use_chat_template is None:
            use_chat_template = getattr(tokenizer, "chat_template", None) is not None
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad_id is None:
            raise ValueError("tokenizer has neither a pad nor an eos token to pad the judge prompts with")
        self.model, self.tokenizer, self.template = model, tokenizer, template
        self.use_chat_template, self.batch_size, self.margin = use_chat_template, batch_size, margin
        self.pad_id = pad_id

    def judge(
        self, prompts: list[str], completions: list[list[str]], shuffle_order: bool = True
    ) -> list[int]:
        check_pairs(prompts, completions)
        n = len(prompts)
        firsts = [pair[0] for pair in completions] + [pair[1] for pair in completions]
        seconds = [pair[1] for pair in completions] + [pair[0] for pair in completions]
        margins = self.choice_margins(list(prompts) * 2, firsts, seconds).tolist()
        return [self._verdict(margins[i], margins[n + i]) for i in range(n)]

    def _verdict(self, as_given: float, swapped: float) -> int:
        """`as_given`: the margin for completion 0 shown first; `swapped`: for completion 1 shown first."""
        if as_given > self.margin and swapped < -self.margin:
            return 0
        if as_given < -self.margin and swapped > self.margin:
            return 1
        return TIE  # the orders disagree (position bias), or one of them is undecided

    def prompt_text(self, prompt: str, first: str, second: str) -> str:
        """The judge prompt for one ordered pair, as the model reads it."""
        filled = self.template.format(prompt=prompt, first=first, second=second)
        if not self.use_chat_template:
            return filled
        messages = [{"role": "user", "content": filled}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    @torch.no_grad()
    def choice_margins(
        self, prompts: Sequence[str], firsts: Sequence[str], seconds: Sequence[str]
    ) -> torch.Tensor:
        """(N,) float32: log p(first choice) - log p(second choice) after each judge prompt."""
        device = next(self.model.parameters()).device
        texts = [self.prompt_text(p, a, b) for p, a, b in zip(prompts, firsts, seconds)]
        # a chat template already holds its special tokens; plain text gets the tokenizer's own (e.g. BOS)
        special = not self.use_chat_template
        encoded = [torch.tensor(self.tokenizer(t, add_special_tokens=special)["input_ids"]) for t in texts]
        limit = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        longest = max((len(ids) for ids in encoded), default=0)
        if isinstance(limit, int) and longest > limit:
            raise ValueError(
                f"a judge prompt is {longest} tokens, more than the judge model's {limit} positions; "
                "shorten the template, the prompts or the completions"
            )
        first_id, second_id = self.choice_ids
        margins = []
        with eval_mode(self.model):
            for start in range(0, len(encoded), self.batch_size):
                query_ids, query_mask = pad_left(encoded[start : start + self.batch_size], self.pad_id)
                # the first choice token stands as a one-token "response": its logits row is the next-token
                # distribution after the judge prompt, which holds both choices
                choice = torch.full((query_ids.shape[0], 1), first_id, dtype=torch.long, device=device)
                real = torch.ones_like(choice, dtype=torch.bool)
                out = forward_response(
                    self.model, query_ids.to(device), query_mask.to(device), choice, real, return_logits=True
                )
                logprobs = torch.log_softmax(out.logits[:, 0].float(), dim=-1)
                margins.append(logprobs[:, first_id] - logprobs[:, second_id])
        return torch.cat(margins).cpu() if margins else torch.zeros(0)
