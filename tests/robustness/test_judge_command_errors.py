"""`rlhfkit judge` refuses bad flags with one line and exit code 2: only `--judge_model positive-review` needs
the optional vaderSentiment (listing the rule judges builds no reward), a misspelt judge lists the choices,
and an existing `--output_file` is kept unless `--overwrite_output_file` is given."""

from __future__ import annotations

import sys

import pytest

from rlhfkit.commands.judge import main
from rlhfkit.judges import RuleJudge, load_judge, rule_judge_names
from rlhfkit.tasks import TASKS, get_task, text_task_names
from rlhfkit.testing import tiny_model_path

SHORT = ["--max_new_tokens", "2", "--batch_size", "2", "--num_examples", "2"]


@pytest.fixture
def no_vader(monkeypatch):
    """vaderSentiment as if it were not installed: importing it raises ImportError."""
    monkeypatch.setitem(sys.modules, "vaderSentiment", None)
    monkeypatch.setitem(sys.modules, "vaderSentiment.vaderSentiment", None)


@pytest.fixture
def policy() -> str:
    return str(tiny_model_path("llama"))


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("rlhfkit judge: error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_listing_the_rule_judges_builds_no_reward(no_vader):
    assert text_task_names() == ["keyword", "length", "positive-review"]
    assert rule_judge_names() == text_task_names()
    for name in ("keyword", "length"):
        assert isinstance(load_judge(name), RuleJudge)


def test_declared_reward_columns_match_the_built_tasks():
    for name in TASKS:
        assert get_task(name).reward_columns == TASKS[name].reward_columns, name


def test_a_rule_judge_runs_without_vader(no_vader, policy, capsys):
    assert main(["--model_name_or_path", policy, "--judge_model", "length", *SHORT]) == 0
    assert "Model win rate:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "judge, expected",
    [
        (None, "--judge_model is required"),
        ("gpt-4", "'gpt-4'"),
        ("positive_review", "Did you mean 'positive-review'"),
    ],
)
def test_a_missing_or_misspelt_judge_lists_the_choices(no_vader, policy, capsys, judge, expected):
    argv = ["--model_name_or_path", policy] + (["--judge_model", judge] if judge else [])
    assert main(argv) == 2
    line = _one_line_error(capsys)
    assert expected in line and "keyword, length, positive-review" in line, line


def test_positive_review_without_vader_says_what_to_install(no_vader, policy, capsys):
    assert main(["--model_name_or_path", policy, "--judge_model", "positive-review", *SHORT]) == 2
    line = _one_line_error(capsys)
    assert "--judge_model 'positive-review'" in line and "pip install 'rlhfkit[demo]'" in line, line


def _no_model_loading(monkeypatch):
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad flag was refused")

    for name in ("AutoModelForCausalLM", "AutoModelForSequenceClassification"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", refuse)


def test_an_existing_output_file_is_kept(policy, tmp_path, capsys, monkeypatch):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("earlier results\n")
    argv = ["--model_name_or_path", policy, "--judge_model", "keyword", "--output_file", str(rows), *SHORT]
    with monkeypatch.context() as patch:
        _no_model_loading(patch)
        assert main(argv) == 2
    line = _one_line_error(capsys)
    assert str(rows) in line and "--overwrite_output_file" in line, line
    assert rows.read_text() == "earlier results\n"
    assert main([*argv, "--overwrite_output_file"]) == 0
    assert len(rows.read_text().splitlines()) == 2


def test_a_bad_dataset_is_refused_before_the_judge_model_loads(policy, tmp_path, capsys, monkeypatch):
    data = tmp_path / "refs.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "c", "completion": \n')
    _no_model_loading(monkeypatch)
    judge = str(tiny_model_path("llama-reward"))
    argv = ["--model_name_or_path", policy, "--judge_model", judge, "--dataset_name", str(data)]
    assert main(argv) == 2
    line = _one_line_error(capsys)
    assert str(data) in line and "line 2" in line, line
