"""GRPO with a tool, on a scripted sampler: shared by the 2-process worker and the 1-process reference.

Every prompt is "What is 6 * 7?". The scripted sampler decides by row: a row that calls the tool writes
`<tool_call>{"name": "multiply", ...}</tool_call>` and, once the tool's answer is in its prompt, "42"; a row
that does not answers "41" at once. The exact answer scores 1, so each group of two (one caller, one not)
has advantages of opposite sign, and every update moves the policy. The sampled tokens are the script's;
their logprobs are the policy's own (a forward pass), as a real sampler's would be.
"""

from __future__ import annotations

import os

import torch
from datasets import Dataset

from rlhfkit.rollout import forward_response
from rlhfkit.rollout.backends import GenerationBackend, GenerationOutput
from rlhfkit.rollout.generation import pad_right
from rlhfkit.testing import tiny_model
from rlhfkit.testing.chat_templates import tool_chat_tokenizer

from .rl_fixtures import sgd

CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a * b


def exact_answer(prompts, completions, **columns) -> list[float]:
    """1 when the conversation's last message is "42"."""
    return [float(c[-1]["content"].strip() == "42") for c in completions]


def _contains(sequence: list[int], part: list[int]) -> bool:
    return any(sequence[i : i + len(part)] == part for i in range(len(sequence) - len(part) + 1))


class ScriptedToolSampler(GenerationBackend):
    """Turn 1: row i calls the tool when `calls(i)`, else answers "41"; a row whose prompt holds the call
    answers "42". Each reply ends with the EOS token."""

    def __init__(self, model, tokenizer, calls) -> None:
        self.model, self.calls = model, calls
        self.call = tokenizer.encode(CALL, add_special_tokens=False)
        self.answers = {text: tokenizer.encode(text, add_special_tokens=False) for text in ("41", "42")}
        self.eos, self.pad = tokenizer.eos_token_id, tokenizer.pad_token_id

    def _sample(self, query_ids, query_mask, params, logprob_temperature) -> GenerationOutput:
        replies = []
        for i, (ids, mask) in enumerate(zip(query_ids.tolist(), query_mask.tolist())):
            prompt = [t for t, m in zip(ids, mask) if m]
            text = self.answers["42"] if _contains(prompt, self.call) else None
            reply = text or (self.call if self.calls(i) else self.answers["41"])
            replies.append(torch.tensor([*reply, self.eos][: params.max_new_tokens]))
        responses, response_mask = pad_right(replies, self.pad)
        with torch.no_grad():
            logprobs = forward_response(
                self.model, query_ids, query_mask, responses, response_mask,
                temperature=logprob_temperature or 1.0,
            ).logprobs  # fmt: skip
        return GenerationOutput(responses, response_mask.bool(), logprobs)


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def grpo_tools_trainer(out: str, per_device: int, calls, **kw):
    """A GRPOTrainer with the `multiply` tool whose sampler is `ScriptedToolSampler(calls)`; plain SGD."""
    from rlhfkit.trainers.grpo.config import GRPOConfig
    from rlhfkit.trainers.grpo.trainer import GRPOTrainer

    cfg = dict(
        output_dir=out, report_to="none", use_cpu=True, per_device_train_batch_size=per_device,
        num_generations=2, max_completion_length=96, max_tool_calling_iterations=2, tool_timeout=10.0,
        max_steps=1, logging_steps=1, save_strategy="no", disable_tqdm=True, seed=3, max_grad_norm=0.0,
        loss_type="dapo",
    )  # fmt: skip
    cfg.update(kw)
    policy, tokenizer = tiny_model("llama"), tool_chat_tokenizer("gpt2")
    tokenizer.padding_side = "left"
    cfg, optimizers = sgd(policy, cfg)
    prompts = [[{"role": "user", "content": "What is 6 * 7?"}]] * 16
    trainer = GRPOTrainer(
        policy,
        exact_answer,
        args=GRPOConfig(**cfg),
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        optimizers=optimizers,
        tools=[multiply],
    )
    trainer._sampler = lambda *args, **kwargs: ScriptedToolSampler(
        trainer.accelerator.unwrap_model(trainer.model), tokenizer, calls
    )
    return trainer


def flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def tool_metrics(trainer) -> dict[str, float]:
    """The `tools/*` figures of the trainer's first logged step."""
    logged = next(h for h in trainer.state.log_history if "tools/call_frequency" in h)
    return {k: v for k, v in logged.items() if k.startswith("tools/")}
