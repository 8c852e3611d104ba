"""`rlhfkit sft` end to end: a packed subprocess run, and clear errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlhfkit.commands.sft import main
from rlhfkit.testing import tiny_model_path

DOCS = [
    "the cat sat on the mat",
    "a dog ran far away today",
    "hello there friend of mine",
    "rain falls on the quiet town",
    "we like to read long books at night",
]


@pytest.mark.slow
def test_sft_command_subprocess_packed(tmp_path):
    data = tmp_path / "docs.jsonl"
    data.write_text("\n".join(json.dumps({"text": d}) for d in DOCS * 2))
    out = tmp_path / "sft"
    cmd = [
        sys.executable,
        "-m",
        "rlhfkit",
        "sft",
        "--model_name_or_path",
        str(tiny_model_path("llama")),
        "--dataset_name",
        str(data),
        "--output_dir",
        str(out),
        "--packing",
        "--max_seq_length",
        "16",
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "2",
        "--use_cpu",
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        "--disable_tqdm",
        "true",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["train_loss"] > 0
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    assert (out / "tokenizer.json").exists()


def test_sft_command_bad_input(tmp_path, capsys):
    data = tmp_path / "docs.jsonl"
    data.write_text(json.dumps({"body": "x"}) + "\n")
    code = main(
        [
            "--model_name_or_path",
            str(tiny_model_path("llama")),
            "--dataset_name",
            str(data),
            "--output_dir",
            str(tmp_path / "o"),
            "--use_cpu",
            "--report_to",
            "none",
        ]
    )
    assert code == 2 and "needs the columns" in capsys.readouterr().err
    code = main(
        [
            "--model_name_or_path",
            str(tmp_path / "no-such-model"),
            "--dataset_name",
            str(data),
            "--output_dir",
            str(tmp_path / "o"),
            "--use_cpu",
        ]
    )
    assert code == 2 and "not a local folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: unknown flag
        main(["--dataset_name", str(data), "--no_such_flag", "1"])


def test_sft_command_trains_with_trl1_flags(tmp_path, capsys):
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    code = main([
        "--model_name_or_path", str(tiny_model_path("llama")), "--dataset_name", str(data),
        "--output_dir", str(tmp_path / "o"), "--use_cpu", "--report_to", "none", "--max_steps", "2",
        "--per_device_train_batch_size", "2", "--loss_type", "dft", "--max_length", "16",
        "--save_strategy", "no", "--disable_tqdm", "true",
    ])  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["train_loss"] is not None and 0 < summary["train_loss"] < 10


def _run(tmp_path, capsys, data, *flags):
    code = main([
        "--model_name_or_path", str(tiny_model_path("llama")), "--dataset_name", str(data),
        "--output_dir", str(tmp_path / "o"), "--use_cpu", "--report_to", "none", "--max_steps", "2",
        "--per_device_train_batch_size", "2", "--save_strategy", "no", "--disable_tqdm", "true", *flags,
    ])  # fmt: skip
    captured = capsys.readouterr()
    return code, captured


def test_sft_command_trl1_packing_and_padding_flags(tmp_path, capsys):
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS * 2))
    code, out = _run(tmp_path, capsys, data, "--packing", "--packing_strategy", "bfd", "--max_length", "16",
                     "--shuffle_dataset", "--pad_to_multiple_of", "8", "--eval_packing", "false")  # fmt: skip
    assert code == 0, out.err[-2000:]
    summary = json.loads(out.out.strip().splitlines()[-1])
    assert 0 <= summary["mean_token_accuracy"] <= 1 and summary["num_tokens"] > 0
    code, out = _run(tmp_path, capsys, data, "--padding_free", "--truncation_mode", "keep_end",
                     "--packing_strategy", "wrapped")  # fmt: skip
    assert code == 0, out.err[-2000:]
    code, out = _run(tmp_path, capsys, data, "--packing", "--packing_strategy", "first_fit")
    assert code == 2 and "packing_strategy must be one of" in out.err


def test_sft_command_completion_and_assistant_only_flags(tmp_path, capsys):
    from rlhfkit.testing.tokenizer import CHAT_TEMPLATE

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": d[:8], "completion": d[8:]}) + "\n" for d in DOCS))
    code, out = _run(tmp_path, capsys, pairs, "--completion_only_loss", "false")
    assert code == 0, out.err[-2000:]
    chats = tmp_path / "chats.jsonl"
    rows = [
        {"conversations": [{"from": "user", "value": d[:8]}, {"from": "assistant", "value": d[8:]}]}
        for d in DOCS
    ]
    chats.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # a template whose first line counts the messages is not prefix-stable, and has no generation blocks
    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages | length }} messages\n" + CHAT_TEMPLATE)
    code, out = _run(tmp_path, capsys, chats, "--assistant_only_loss", "--chat_template_path", str(template))
    assert code == 2 and "{% generation %}" in out.err and "prefix-stable" in out.err
    code, out = _run(tmp_path, capsys, chats, "--assistant_only_loss")  # the tiny template: prefix-stable
    assert code == 0, out.err[-2000:]
