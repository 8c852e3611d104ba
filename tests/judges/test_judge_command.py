"""`rlhfkit judge` / `examples/scripts/evals/judge_tldr.py` end to end on tiny local models: TRL 0.x's flags,
a printed win rate with its 95% interval, and offline errors that name the flag."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfkit.cli import COMMANDS
from rlhfkit.commands.judge import JudgeArguments, load_references, main
from rlhfkit.testing import tiny_model_path

ROOT = Path(__file__).resolve().parents[2]
RATE = re.compile(
    r"Model win rate: ([\d.]+)% \(95% CI ([\d.]+)% - ([\d.]+)%; (\d+) pairs: (\d+) wins, (\d+) ties"
)
SHORT = ["--max_new_tokens", "4", "--batch_size", "4"]


def _parse_rate(text: str) -> tuple[float, float, float, int, int, int]:
    match = RATE.search(text)
    assert match, text
    rate, low, high = (float(match.group(i)) for i in (1, 2, 3))
    n, wins, ties = (int(match.group(i)) for i in (4, 5, 6))
    assert 0 <= low <= rate <= high <= 100
    assert rate == pytest.approx(100 * (wins + ties / 2) / n, abs=0.01)
    return rate, low, high, n, wins, ties


@pytest.mark.slow
def test_seed000_flags_with_a_rule_judge_and_the_built_in_prompts(capsys, tmp_path):
    rows = tmp_path / "rows.jsonl"
    argv = [
        "--model_name_or_path",
        str(tiny_model_path("llama")),
        "--judge_model",
        "positive-review",
        "--num_examples",
        "6",
        "--output_file",
        str(rows),
        *SHORT,
    ]
    assert main(argv) == 0
    *_, n, wins, ties = _parse_rate(capsys.readouterr().out)
    assert n == 6
    written = [json.loads(line) for line in rows.read_text().splitlines()]
    assert len(written) == 6 and {"prompt", "reference", "completion", "judgement"} <= set(written[0])
    assert (
        sum(r["judgement"] == 1 for r in written) == wins
        and sum(r["judgement"] == -1 for r in written) == ties
    )


@pytest.mark.slow
@pytest.mark.parametrize("judge", ["llama-reward", "llama"])
def test_local_judge_models_and_a_local_dataset(capsys, tmp_path, judge):
    data = tmp_path / "tldr.jsonl"
    rows = [{"prompt": f"Post {i}: the cat sat.\nTL;DR:", "completion": " a cat sat"} for i in range(5)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = [
        "--model_name_or_path",
        str(tiny_model_path("llama")),
        "--judge_model",
        str(tiny_model_path(judge)),
        "--num_examples",
        "3",
        "--dataset_name",
        str(data),
        *SHORT,
    ]
    assert main(argv) == 0
    assert _parse_rate(capsys.readouterr().out)[3] == 3


@pytest.mark.slow
def test_judge_tldr_script_in_a_subprocess():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    cmd = [
        sys.executable,
        str(ROOT / "examples/scripts/evals/judge_tldr.py"),
        "--model_name_or_path",
        str(tiny_model_path("llama")),
        "--judge_model",
        "keyword",
        "--num_examples",
        "4",
        *SHORT,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _parse_rate(proc.stdout)[3] == 4


def test_hub_names_are_refused_naming_the_flag(capsys, tmp_path):
    policy = str(tiny_model_path("llama"))
    cases = [
        (
            [
                "--model_name_or_path",
                "cleanrl/EleutherAI_pythia-1b-deduped__sft__tldr",
                "--judge_model",
                "keyword",
            ],
            "--model_name_or_path",
        ),
        (["--model_name_or_path", policy, "--judge_model", "gpt-4o-mini"], "--judge_model"),
        (
            ["--model_name_or_path", policy, "--judge_model", "keyword", "--dataset_name", "trl-lib/tldr"],
            "--dataset_name",
        ),
        (
            ["--model_name_or_path", policy, "--judge_model", "keyword", "--num_examples", "0"],
            "--num_examples",
        ),
        (["--model_name_or_path", policy, "--judge_model", "addition"], "--judge_model"),  # needs its columns
    ]
    for argv, flag in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert flag in err and "Traceback" not in err, err


def test_references_come_from_the_named_columns(tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"question": "q1", "answer": "a1"}\n{"question": "q2", "answer": "a2"}\n')
    args = JudgeArguments(
        dataset_name=str(data), prompt_column="question", completion_column="answer", num_examples=1
    )
    assert load_references(args) == (["q1"], ["a1"])
    with pytest.raises(ValueError, match="--completion_column"):
        load_references(JudgeArguments(dataset_name=str(data), prompt_column="question"))
    prompts, references = load_references(JudgeArguments(num_examples=3))  # built-in review openings
    assert len(prompts) == len(references) == 3 and all(r.strip() for r in references)


def test_cli_lists_the_judge_command():
    assert COMMANDS["judge"][0] == "rlhfkit.commands.judge"
