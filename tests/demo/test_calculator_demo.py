"""`rlhfkit demo --task calculator`: settings, episode summaries and report, the pipeline end to end."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlhfkit.commands import demo
from rlhfkit.demo import tool_use
from rlhfkit.demo.cache import StageResult
from rlhfkit.demo.config import DemoConfig
from rlhfkit.tasks.calculator import transcript


def test_calculator_runs_grpo_with_its_own_preset():
    cfg = DemoConfig(task="calculator")
    assert cfg.algo == "grpo" and cfg.response_length == 96 and cfg.sft_target_accuracy == 0.3
    assert (cfg.rl_updates, cfg.temperature) == (100, 0.7)  # what lifted seeds 0-2 past +25
    with pytest.raises(ValueError, match="--algo must be one of grpo for --task calculator"):
        DemoConfig(task="calculator", algo="rloo")


def test_conversation_text_shows_calls_results_and_answer():
    assert (
        tool_use.conversation_text(transcript(417, 86)[1:]) == "multiply(a=417, b=86) -> 35862; answer 35862"
    )
    unanswered = [{"role": "assistant", "content": "", "tool_calls": transcript(3, 4)[1]["tool_calls"]}]
    assert tool_use.conversation_text(unanswered) == "multiply(a=3, b=4)"
    assert tool_use.conversation_text([{"role": "assistant", "content": "12"}]) == "answer 12"
    assert tool_use.conversation_text([]) == "(nothing)"


def test_tool_result_right_reads_tool_messages_only():
    conversation = transcript(417, 86)[1:]
    assert tool_use._tool_result_right(conversation, "35862")
    assert not tool_use._tool_result_right(conversation[-1:], "35862")  # the answer is not a tool result


def _summaries() -> dict[str, StageResult]:
    evaluation = {"num_prompts": 512, "lift_points": 31.25}
    for name, (no_tools, greedy, use) in {"sft": (0.0, 0.25, 0.9), "rl": (0.0, 0.5625, 1.0)}.items():
        for key, value in (("no_tools", no_tools), ("greedy", greedy), ("tool_use", use)):
            evaluation[f"{key}_{name}"] = value
            evaluation[f"{key}_{name}_ci95"] = [value / 2, (1 + value) / 2]
        evaluation[f"wrong_call_{name}"], evaluation[f"misread_result_{name}"] = 0.25, 0.125
    summaries = {
        "base": {"parameters": 551552, "architecture": "llama"},
        "sft": {"steps": 140},
        "rl": {"steps": 60},
        "evaluation": evaluation,
    }
    return {key: StageResult(key, Path(key), "h", summary, 1.0) for key, summary in summaries.items()}


def test_report_states_the_three_accuracies_with_intervals():
    text = "\n".join(tool_use.result_lines(DemoConfig(task="calculator"), "multiply", _summaries()))
    assert (
        "from **25.0% (12.5-62.5%)** after SFT to **56.2% (28.1-78.1%)** after GRPO: **+31.2 points**" in text
    )
    assert "| SFT warm start | 0.0% (0.0-50.0%) | **25.0% (12.5-62.5%)** | 90.0% | 25.0% | 12.5% |" in text
    assert "| GRPO, 60 steps | 0.0% (0.0-50.0%) | **56.2% (28.1-78.1%)** | 100.0% | 25.0% | 12.5% |" in text
    assert "stopped after 140 steps" in text and "Wilson" in text
    row = {
        "prompt": "3*4",
        "answer": "12",
        "greedy_sft": "answer 13",
        "greedy_rl": "multiply(a=3, b=4) -> 12; answer 12",
    }
    lines = tool_use.sample_lines(
        DemoConfig(task="calculator"), [{**row, "right_sft": False, "right_rl": True}]
    )
    assert lines[-1] == "| `3*4` | 12 | answer 13 ✗ | multiply(a=3, b=4) -> 12; answer 12 ✓ |"


def test_calculator_demo_end_to_end_from_the_command_is_deterministic(tmp_path):
    """Two tiny runs, about 40 s together on two CPU cores."""
    from rlhfkit.demo import run_demo

    out = tmp_path / "first"
    assert demo.main(["--task", "calculator", "--size", "tiny", "--output_dir", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    ev = metrics["evaluation"]
    assert ev["num_prompts"] == 32
    for key in ("no_tools_sft", "greedy_sft", "no_tools_rl", "greedy_rl", "tool_use_sft", "tool_use_rl"):
        low, high = ev[f"{key}_ci95"]
        assert 0.0 <= low <= ev[key] <= high <= 1.0
    assert ev["tools/call_frequency_rl"] >= 0.0 and "tools/malformed_sft" in ev
    assert metrics["stages"]["sft"]["summary"]["steps"] == 40  # the tiny preset: SFT far from the target
    samples = [
        json.loads(line) for line in (out / "evaluation-calculator/samples.jsonl").read_text().splitlines()
    ]
    assert len(samples) == 32 and all(
        int(s["answer"]) == eval_product(s["prompt"]) and isinstance(s["right_rl"], bool) for s in samples
    )
    curves = json.loads((out / "rl-grpo-calculator/curves.json").read_text())
    assert curves["step"] == [1, 2, 3] and all(0.0 <= r <= 1.0 for r in curves["reward"])
    assert all(c is not None and c >= 0.0 for c in curves["tool_calls"])
    report = (out / "report.md").read_text()
    assert "accuracy without tools" in report and "Sample conversations" in report
    # same seed, fresh folder: every measured number agrees exactly
    again = run_demo(DemoConfig(task="calculator", size="tiny", output_dir=str(tmp_path / "second")))
    assert again["evaluation"] == ev
    assert json.loads((tmp_path / "second/rl-grpo-calculator/curves.json").read_text()) == curves


def eval_product(question: str) -> int:
    a, b = question.split("*")
    return int(a) * int(b)


def _probe_run(accuracies: dict[int, float], near_every, steps: int = 200):
    """Drive the SFT stop callback over `steps` steps of a one-weight model whose weight is the step number;
    `accuracies` scripts what the train probe measures at a step (0 where not given)."""
    import torch
    from transformers import TrainerControl

    from rlhfkit.demo import verifiable
    from rlhfkit.tasks import get_task

    model = torch.nn.Linear(1, 1, bias=False)
    log = verifiable.ProbeLog()
    callback = verifiable._stop_at_accuracy(
        DemoConfig(task="calculator"), get_task("calculator"), None, log, near_every
    )
    original = verifiable._greedy_accuracy
    verifiable._greedy_accuracy = lambda cfg, task, m, tok, data: accuracies.get(int(m.weight.item()), 0.0)
    try:
        for step in range(1, steps + 1):
            with torch.no_grad():
                model.weight.fill_(step)
            control = callback.on_step_end(
                None, SimpleNamespace(global_step=step), TrainerControl(), model=model
            )
            if control.should_training_stop:
                break
    finally:
        verifiable._greedy_accuracy = original
    return log, step, int(model.weight.item())


def test_sft_probe_goes_finer_near_the_skill_and_keeps_the_policy_closer_to_the_target():
    # target 0.3: 0.25 at step 124 is 0.05 under it, 0.41 at step 126 0.11 over: the step-124 policy is kept
    seen = {120: 0.02, 122: 0.10, 124: 0.25, 126: 0.41}
    log, stopped, weight = _probe_run(seen, near_every=2)
    assert log.steps == [20, 40, 60, 80, 100, 120, 122, 124, 126]  # every 20, every 2 after the first right
    assert (stopped, log.kept_step, log.kept_accuracy, weight) == (126, 124, 0.25, 124)
    # 0.31 is closer than 0.22: the policy that crossed is kept, nothing is restored
    log, stopped, weight = _probe_run({120: 0.05, 122: 0.22, 124: 0.31}, near_every=2)
    assert (stopped, log.kept_step, weight) == (124, None, 124)


def test_sft_probe_without_fine_steps_stops_at_the_first_crossing():
    # the addition demo's probe: every 20 steps, and the policy that crossed the target is the warm start
    log, stopped, weight = _probe_run({120: 0.02, 140: 0.45}, near_every=None)
    assert log.steps == [20, 40, 60, 80, 100, 120, 140] and (stopped, log.kept_step, weight) == (
        140,
        None,
        140,
    )
    log, stopped, _ = _probe_run({}, near_every=2, steps=50)  # never right: probes every 20, runs to the end
    assert log.steps == [20, 40] and stopped == 50 and log.kept_step is None
