"""A malformed or empty local dataset file fails with a ValueError that names the file and says what is
wrong, never a `datasets` traceback; the commands turn it into one line and exit code 2 before loading a
model."""

from __future__ import annotations

import json

import pytest

from rlhfkit.data.loading import load_local_dataset, load_splits

ROW = json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"})

CASES = [
    ("empty jsonl", "d.jsonl", "", "is empty"),
    ("blank jsonl", "d.jsonl", "\n  \n\n", "is empty"),
    ("empty json", "d.json", "", "is empty"),
    ("empty csv", "d.csv", "", "is empty"),
    ("header-only csv", "d.csv", "prompt,chosen,rejected\n", "no rows"),
    ("malformed jsonl line", "d.jsonl", f'{ROW}\n{ROW}\n{{"prompt": "a", "chosen": \n', "line 3"),
    ("jsonl line not an object", "d.jsonl", f"{ROW}\n[1, 2]\n", "line 2"),
    ("truncated json array", "d.json", f"[\n{ROW},\n{ROW},\n", "line 4"),
    ("ragged csv", "d.csv", "prompt,chosen\na,b\nc,d,e,f\n", "line 3"),
    ("not a parquet file", "d.parquet", "hello\n", "parquet"),
]


@pytest.mark.parametrize("name, content, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_file_is_named(tmp_path, name, content, expected):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError) as info:
        load_splits(str(path))
    message = str(info.value)
    assert str(path) in message and expected in message and "\n" not in message, message


def test_the_bad_file_of_a_folder_is_named(tmp_path):
    (tmp_path / "a.jsonl").write_text(f"{ROW}\n")
    (tmp_path / "b.jsonl").write_text(f"{ROW}\n{{oops\n")
    with pytest.raises(ValueError, match=r"b\.jsonl.*line 2"):
        load_local_dataset(str(tmp_path))


def test_an_upper_case_extension_is_read(tmp_path):
    path = tmp_path / "pairs.JSONL"
    path.write_text(f"{ROW}\n")
    assert load_local_dataset(str(path))["train"]["prompt"] == ["a"]


@pytest.mark.parametrize("command", ["dpo", "rloo"])
def test_commands_refuse_a_bad_file_in_one_line(tmp_path, capsys, command):
    import importlib

    path = tmp_path / "pairs.jsonl"
    path.write_text("")
    main = importlib.import_module(f"rlhfkit.commands.{command}").main
    # the model flag names no folder: the data error must come first
    argv = ["--dataset_name", str(path), "--model_name_or_path", str(tmp_path / "no-model")]
    assert main([*argv, "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(path) in err and "is empty" in err, err
