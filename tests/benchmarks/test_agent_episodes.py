"""benchmarks/agent_episodes.py's pure parts: the arguments, the per-run summary, the round order, the
comparison, the task file TRL's process loads, and the response template TRL parses the calculator
template's tool calls with."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from test_harness import _load

from rlhfkit.agents.parsing import parse_hermes
from rlhfkit.tasks import calculator
from rlhfkit.testing import tiny_tokenizer

bench = _load("agent_episodes")


def test_arguments_are_checked_with_the_flag_named(capsys):
    args = bench.parse_args([])
    assert (args.paths, args.steps, args.rounds, args.threads) == (["rlhfkit", "trl"], 3, 1, 1)
    assert bench.parse_args(["--paths", "trl,rlhfkit-vllm-server"]).paths == ["trl", "rlhfkit-vllm-server"]
    for bad, flag in (
        (["--paths", "rlhfkit,vllm"], "--paths"),
        (["--paths", ","], "--paths"),
        (["--steps", "0"], "--steps"),
        (["--rounds", "0"], "--rounds"),
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
        assert flag in capsys.readouterr().err


def _run(path="rlhfkit"):
    # 3 steps of 128 episodes; the first (0 -> 5 s) is not timed
    ticks = [[0.0, 0.0, 0], [5.0, 3.0, 1000], [7.0, 4.0, 1640], [10.0, 6.0, 2600]]
    logs = [
        {"tools/call_frequency": 0.5, "completions/mean_length": 40.0, "reward": 0.0},
        {"tools/call_frequency": 1.0, "completions/mean_length": 60.0, "reward": 0.25},
        {"tools/call_frequency": 2.0, "completions/mean_length": 70.0, "reward": 0.75},
    ]
    return {"path": path, "ticks": ticks, "logs": logs, "episodes_per_step": 128}


def test_a_run_is_summarised_over_its_timed_steps_only():
    summary = bench.summarise(_run())
    # timed: 2 steps, 2 + 3 = 5 s of wall, 1 + 2 = 3 s of CPU, 2600 - 1000 = 1600 tokens, 256 episodes
    assert summary["steps_timed"] == 2
    assert summary["episodes_per_s"] == pytest.approx(256 / 5)
    assert summary["sampled_tokens_per_s"] == pytest.approx(1600 / 5)
    assert summary["seconds_per_step"] == pytest.approx(2.5)
    assert summary["cpu_seconds_per_step"] == pytest.approx(1.5)
    assert summary["sampled_tokens_per_episode"] == pytest.approx(1600 / 256)
    assert summary["tool_calls_per_episode"] == pytest.approx(
        1.5
    )  # (1 + 2) / 2: the first step's 0.5 left out
    assert summary["model_tokens_per_episode"] == pytest.approx(65.0)
    assert summary["reward_mean"] == pytest.approx(0.5)
    assert summary["step_seconds"] == [5.0, 2.0, 3.0]


def test_a_run_without_a_timed_step_or_with_missing_logs_is_refused():
    short = {**_run(), "ticks": _run()["ticks"][:2], "logs": _run()["logs"][:1]}
    with pytest.raises(ValueError, match="rlhfkit: 2 clock ticks and 1 step logs"):
        bench.summarise(short)
    with pytest.raises(ValueError, match="4 clock ticks and 2 step logs"):
        bench.summarise({**_run(), "logs": _run()["logs"][:2]})


def test_rounds_alternate_which_library_goes_first():
    assert [bench.round_order(["rlhfkit", "trl"], i) for i in range(3)] == [
        ["rlhfkit", "trl"],
        ["trl", "rlhfkit"],
        ["rlhfkit", "trl"],
    ]


def test_comparison_takes_the_median_over_rounds_and_skips_failed_runs():
    runs = [{"path": "rlhfkit", **bench.summarise(_run())} for _ in range(2)]
    slow = {**_run("trl"), "ticks": [[t[0] * 2, t[1], t[2]] for t in _run()["ticks"]]}  # twice the wall time
    runs += [{"path": "trl", **bench.summarise(slow)}, {"path": "trl", "error": "exit 1: boom"}]
    summary = bench.compare(runs)
    assert summary["median"]["rlhfkit"]["episodes_per_s"] == pytest.approx(256 / 5, abs=0.01)
    assert summary["median"]["trl"]["episodes_per_s"] == pytest.approx(256 / 10, abs=0.01)
    assert summary["episodes_per_s_ratio"] == 2.0
    assert summary["cpu_seconds_ratio"] == 1.0  # the CPU seconds were the same
    assert "episodes_per_s_ratio" not in bench.compare(runs[:2])


def test_trl_process_loads_the_same_task_file():
    loaded = bench.load_calculator()
    assert loaded.CHAT_TEMPLATE == calculator.CHAT_TEMPLATE
    assert loaded.multiply(417, 86) == 35862 and loaded.multiply.__doc__ == calculator.multiply.__doc__
    data = loaded.calculator_prompt_dataset("train", n=4, seed=0)
    assert data["prompt"] == calculator.calculator_prompt_dataset("train", n=4, seed=0)["prompt"]


def test_trls_process_loads_the_task_with_no_other_rlhfkit_code(tmp_path):
    # TRL's venv has no rlhfkit: the task's one rlhfkit import (the answer's text) is loaded by its path
    code = (
        f"import sys; sys.path.insert(0, {str(Path(bench.__file__).parent)!r}); import agent_episodes as a; "
        "task = a.load_calculator(); "
        "print(sorted(k for k in sys.modules if k.startswith('rlhfkit'))); "
        "print(task.calculator_reward([[{'role': 'tool', 'content': '12'}, {'role': 'assistant', "
        "'content': '12'}], [{'role': 'assistant', 'content': '<tool_call>x</tool_call>'}, "
        "{'role': 'tool', 'content': '12'}]], answer=['12', '12']))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["['rlhfkit.rewards.rules']", "[1.0, 0.0]"]


def test_the_response_template_reads_the_calculator_templates_calls_as_rlhfkit_does():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = calculator.CHAT_TEMPLATE
    tokenizer.response_template = bench.RESPONSE_TEMPLATE
    conversation = calculator.transcript(417, 86)  # user, call, tool result, answer
    render = tokenizer.apply_chat_template
    prompt = render(
        conversation[:1], tools=calculator.tool_schemas(), add_generation_prompt=True, tokenize=False
    )
    with_call = render(conversation[:2], tools=calculator.tool_schemas(), tokenize=False)
    call_turn = with_call[len(prompt) :].rstrip("\n")
    assert call_turn == '<tool_call>{"name":"multiply","arguments":{"a":417,"b":86}}</tool_call><|endoftext|>'
    encode = tokenizer.encode
    parsed = tokenizer.parse_response(encode(call_turn), prefix=encode(prompt), tools=[calculator.multiply])
    assert parsed["tool_calls"] == [calculator.tool_call(417, 86)] == parse_hermes(call_turn).tool_calls
    # after the tool's result: the earlier turn's call is not read again (parsing starts at the last turn)
    before_answer = render(
        conversation[:3], tools=calculator.tool_schemas(), add_generation_prompt=True, tokenize=False
    )
    answer = tokenizer.parse_response(encode("35862<|endoftext|>"), prefix=encode(before_answer))
    assert answer == {"role": "assistant", "content": "35862"}
    with pytest.raises(ValueError, match="JSON"):  # TRL reads such a turn as text, without a call
        tokenizer.parse_response(encode('<tool_call>{"name":"multiply"</tool_call>'), prefix=encode(prompt))


def test_the_speed_paragraph_quotes_the_committed_result_file():
    root = Path(__file__).resolve().parents[2]
    report = json.loads((root / "benchmarks" / "agent_episodes" / "calculator.json").read_text())
    text = " ".join((root / "docs" / "agents.md").read_text().split("## Speed", 1)[1].split())
    median, runs = report["summary"]["median"], report["runs"]
    workload = report["workload"]
    quoted = [
        f"commit {report['commit'][:7]}",
        f"{workload['rounds']} rounds of {workload['steps_timed']} timed steps",
        f"{workload['per_device_train_batch_size']} episodes per step",
        f"at most {workload['max_completion_length']} completion tokens",
        f"{report['summary']['episodes_per_s_ratio']:.2f}x in wall time",
        f"{report['summary']['cpu_seconds_ratio']:.2f}x in CPU time per step",
    ]
    for path in ("rlhfkit", "trl"):
        mine = [r for r in runs if r["path"] == path]
        quoted += [
            f"{median[path]['episodes_per_s']:.1f} episodes/s",
            f"{median[path]['sampled_tokens_per_s']:,.0f}",
            f"{median[path]['seconds_per_step']:.2f} s per step",
            f"{median[path]['cpu_seconds_per_step']:.2f} s",
            f"{statistics.median(r['tool_calls_per_episode'] for r in mine)}",  # calls per episode
            f"{min(r['peak_rss_mib'] for r in mine)} to {max(r['peak_rss_mib'] for r in mine)} MiB",
            f"{statistics.median(r['sampled_tokens_per_episode'] for r in mine):.1f} tokens per episode",
        ]
    loads = [r["load_average_end"][0] for r in runs]
    quoted.append(f"load average {min(loads):.1f} to {max(loads):.1f}")
    assert [q for q in quoted if q not in text] == []
