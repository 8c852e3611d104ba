"""A verifiable task solved with tools (`rlhfkit demo --task calculator`): episodes, accuracy, report.

The policy answers held-out problems in whole episodes (`rlhfkit.agents.run_episodes`, greedy): it may call
the task's tools, reads their results and answers. Accuracy is the share of episodes whose final answer is
exactly right. Each policy is measured twice: *with tools* (offered in the prompt and run) and *without*
(none offered, and a call the model still writes is not run), which is what the model can do alone.
The summary also splits the failures: an episode whose tool result already was the answer but whose final
answer is not misread the result; one whose tool result was not the answer made a wrong call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlhfkit.demo import stages
from rlhfkit.demo.cache import StageResult
from rlhfkit.demo.config import DemoConfig
from rlhfkit.demo.verifiable import _accuracy
from rlhfkit.tasks import Task

TOOL_TIMEOUT = 5.0  # seconds; the calculator answers in microseconds
MAX_TOOL_ITERATIONS = 2  # tool-calling rounds per episode, in RL and evaluation
SFT_TRANSCRIPTS = 256  # distinct train problems in the SFT warm start: few, so that the start is imperfect
# SFT probes every this many steps once it sees a right answer: copying appears within a few steps (seed 1:
# 25% of the train probe at step 130, 41% at 132), so probing every 20 stopped seeds anywhere from 32% to 53%
SFT_PROBE_NEAR_EVERY = 2


def greedy_episodes(
    policy: Any, tokenizer: Any, task: Task, prompts: Sequence[list[dict]], max_new_tokens: int, tools: bool
) -> list[Any]:
    """One greedy episode per conversational prompt; `tools=False` offers and runs none."""
    import torch

    from rlhfkit.agents import ToolBox, run_episodes
    from rlhfkit.data.preparation import render_chat
    from rlhfkit.rollout import SamplingParams, make_generation_backend

    toolbox = ToolBox(list(task.tools)) if tools else None
    schemas = toolbox.schemas if toolbox is not None else None
    texts = [render_chat(tokenizer, p, add_generation_prompt=True, tools=schemas) for p in prompts]
    prompt_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    params = SamplingParams(
        max_new_tokens=max_new_tokens, do_sample=False, stop_token_ids=(tokenizer.eos_token_id,)
    )
    with torch.no_grad():
        return run_episodes(
            make_generation_backend(policy, tokenizer.pad_token_id, chunk_size=256),
            params,
            [list(ids) for ids in prompt_ids],
            [toolbox] * len(prompt_ids),
            tokenizer,
            max_iterations=MAX_TOOL_ITERATIONS,
            max_completion_length=max_new_tokens,
            max_model_length=None,
            logprob_temperature=None,
            tool_timeout=TOOL_TIMEOUT,
            pad_token_id=tokenizer.pad_token_id,
        )


def greedy_accuracy(policy: Any, tokenizer: Any, task: Task, data: Any, max_new_tokens: int) -> float:
    """The share of `data`'s problems ("prompt", "answer" columns) a policy answers right with tools."""
    episodes = greedy_episodes(policy, tokenizer, task, data["prompt"], max_new_tokens, tools=True)
    scores = task.reward([e.messages for e in episodes], answer=list(data["answer"]))
    return sum(scores) / len(scores)


def _tool_result_right(messages: list[dict], answer: str) -> bool:
    return any(m.get("role") == "tool" and str(m.get("content")).strip() == answer for m in messages)


def conversation_text(messages: list[dict]) -> str:
    """An episode in one line: `multiply(a=417, b=86) -> 35862; answer 35862`."""
    parts = []
    for message in messages:
        if message.get("role") == "tool":
            parts.append(f"-> {message.get('content')}")
        for call in message.get("tool_calls") or []:
            function = call.get("function", call)
            arguments = ", ".join(f"{k}={v}" for k, v in (function.get("arguments") or {}).items())
            parts.append(f"{function.get('name')}({arguments})")
        if message.get("role") == "assistant" and message.get("content"):
            parts.append(f"answer {message['content']}")
    return "; ".join(parts).replace("; ->", " ->") or "(nothing)"


def _measure(cfg: DemoConfig, task: Task, stage: StageResult, tokenizer: Any, held_out: Any, name: str):
    """Accuracy with and without tools, tool use and the failure split of one policy; its conversations."""
    from rlhfkit.agents import episode_metrics

    policy = stages.load_policy(stage.path)
    answers = list(held_out["answer"])
    metrics: dict[str, Any] = {}
    conversations = {}
    for tools, key in ((False, "no_tools"), (True, "greedy")):  # "greedy": with tools, the headline figure
        episodes = greedy_episodes(policy, tokenizer, task, held_out["prompt"], cfg.response_length, tools)
        scores = task.reward([e.messages for e in episodes], answer=answers)
        _accuracy(metrics, f"{key}_{name}", scores)
        conversations[key] = [conversation_text(e.messages) for e in episodes]
    conversations["right"] = [score == 1.0 for score in scores]
    # the episodes with tools: how often the policy called one, and why its wrong answers were wrong
    _accuracy(metrics, f"tool_use_{name}", [float(e.tool_calls > 0) for e in episodes])
    result_right = [_tool_result_right(e.messages, a) for e, a in zip(episodes, answers)]
    metrics[f"wrong_call_{name}"] = 1 - sum(result_right) / len(result_right)
    misread = [right and score < 1.0 for right, score in zip(result_right, scores)]
    metrics[f"misread_result_{name}"] = sum(misread) / len(misread)
    metrics.update({f"{key}_{name}": value for key, value in episode_metrics(episodes).items()})
    return metrics, conversations


def evaluate(cfg: DemoConfig, task: Task, sft: StageResult, rl: StageResult, out: Path) -> dict[str, Any]:
    """Held-out accuracy of the SFT and GRPO policies, with and without tools; samples.jsonl."""
    tokenizer = stages.load_tokenizer(sft.path)
    held_out = task.prompt_dataset("test", n=cfg.eval_num_prompts, seed=cfg.seed)
    metrics: dict[str, Any] = {"task": task.name, "num_prompts": len(held_out)}
    texts = {}
    for name, stage in (("sft", sft), ("rl", rl)):
        measured, texts[name] = _measure(cfg, task, stage, tokenizer, held_out, name)
        metrics.update(measured)
    metrics["lift_points"] = 100 * (metrics["greedy_rl"] - metrics["greedy_sft"])
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    with open(out / "samples.jsonl", "w", encoding="utf-8") as fh:
        for i, (prompt, answer) in enumerate(zip(held_out["prompt"], held_out["answer"])):
            row = {"prompt": prompt[-1]["content"], "answer": answer}
            row.update({f"{k}_{name}": texts[name][k][i] for name in texts for k in texts[name]})
            fh.write(json.dumps(row) + "\n")
    return metrics


def stage_settings() -> dict[str, Any]:
    """The module's constants that change what a stage computes: part of the stages' cache keys."""
    return {
        "sft_transcripts": SFT_TRANSCRIPTS,
        "max_tool_iterations": MAX_TOOL_ITERATIONS,
        "sft_probe_near_every": SFT_PROBE_NEAR_EVERY,
    }


# ---------------------------------------------------------------------- report
def _percent(ev: dict[str, Any], key: str) -> str:
    low, high = ev[f"{key}_ci95"]
    return f"{100 * ev[key]:.1f}% ({100 * low:.1f}-{100 * high:.1f}%)"


def result_lines(cfg: DemoConfig, description: str, results: dict[str, StageResult]) -> list[str]:
    ev, base, sft = results["evaluation"].summary, results["base"].summary, results["sft"].summary
    labels = {"sft": "SFT warm start", "rl": f"GRPO, {results['rl'].summary['steps']} steps"}
    rows = [
        f"| {label} | {_percent(ev, f'no_tools_{name}')} | **{_percent(ev, f'greedy_{name}')}** | "
        f"{100 * ev[f'tool_use_{name}']:.1f}% | {100 * ev[f'wrong_call_{name}']:.1f}% | "
        f"{100 * ev[f'misread_result_{name}']:.1f}% |"
        for name, label in labels.items()
    ]
    return [
        f"# rlhfkit demo report: {cfg.task} (verifiable reward, tools)",
        "",
        f"Task: {description}. SFT warm start on {SFT_TRANSCRIPTS} tool-call transcripts (stopped after "
        f"{sft['steps']} steps) -> GRPO with the tool on the exact reward; no reward model, no judge. Size "
        f"preset `{cfg.size}`, seed {cfg.seed}, {base['parameters'] / 1e6:.2f}M-parameter "
        f"{base['architecture']} policy.",
        "",
        "## Result",
        "",
        f"On {ev['num_prompts']} held-out problems, accuracy with the tool goes from "
        f"**{_percent(ev, 'greedy_sft')}** after SFT to **{_percent(ev, 'greedy_rl')}** after GRPO: "
        f"**{ev['lift_points']:+.1f} points**. Without the tool the policy answers "
        f"{_percent(ev, 'no_tools_sft')} (SFT) and {_percent(ev, 'no_tools_rl')} (GRPO).",
        "",
        "| policy | accuracy without tools (95% interval) | with tools (95% interval) | tool use | "
        "wrong call | misread result |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        "Accuracy: the share of held-out problems whose greedy episode ends in exactly the answer. Tool use: "
        "the share of episodes with a tool call; wrong call: no tool result was the answer; misread result: "
        "a tool result was the answer, the final answer was not. Intervals: Wilson score, 95%.",
        "",
    ]


def sample_lines(cfg: DemoConfig, samples: Sequence[dict[str, Any]]) -> list[str]:
    from rlhfkit.demo.report import _md_cell

    lines = [
        "",
        "## Sample conversations (held-out, greedy, with the tool)",
        "",
        "| problem | answer | SFT | GRPO |",
        "|---|---|---|---|",
    ]
    for row in samples[: cfg.eval_samples_shown]:
        marks = {name: "✓" if row[f"right_{name}"] else "✗" for name in ("sft", "rl")}
        cells = [f"{_md_cell(row[f'greedy_{name}'])} {marks[name]}" for name in ("sft", "rl")]
        lines.append(f"| `{row['prompt']}` | {row['answer']} | {cells[0]} | {cells[1]} |")
    return lines


def print_samples(samples: Sequence[dict[str, Any]], console=None) -> None:
    """A rich table: held-out problems, their answers and the SFT and GRPO conversations with the tool."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="held-out problems: greedy conversations with the tool")
    for column in ("problem", "answer", "SFT", "GRPO"):
        table.add_column(column)
    for row in samples:
        table.add_row(row["prompt"], row["answer"], row["greedy_sft"], row["greedy_rl"])
    (console or Console()).print(table)
