"""GRPO with a tool, on a scripted sampler: shared by the 2-process worker and the 1-process reference.

Every prompt is "What is 6 * 7?". The sampler (`rlhfkit.testing.scripted`) decides by row: a row that calls
the tool writes `<tool_call>{"name": "multiply", ...}</tool_call>` and, once the tool's answer is in its
context, "42"; a row that does not answers "41" at once. The exact answer scores 1, so each group of two
(one caller, one not) has advantages of opposite sign, and every update moves the policy.
"""

from __future__ import annotations

import os

import torch
from datasets import Dataset

from rlhfkit.testing import tiny_model
from rlhfkit.testing.chat_templates import tool_chat_tokenizer
from rlhfkit.testing.scripted import scripted_sampler

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


def tool_script(calls):
    """The sampler's script: row `row` of a turn-1 call writes the call when `calls(row)`, else "41"; a row
    whose context holds the tool's answer writes "42"."""

    def script(context: str, row: int) -> str:
        if CALL in context:
            return "42"
        return CALL if calls(row) else "41"

    return script


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
    trainer._sampler = lambda *args, **kwargs: scripted_sampler(
        trainer.accelerator.unwrap_model(trainer.model), tokenizer, tool_script(calls)
    )
    return trainer


def flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def tool_metrics(trainer) -> dict[str, float]:
    """The `tools/*` figures of the trainer's first logged step."""
    logged = next(h for h in trainer.state.log_history if "tools/call_frequency" in h)
    return {k: v for k, v in logged.items() if k.startswith("tools/")}
