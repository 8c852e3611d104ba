"""TRL 1.x's DPO and reward options through `rlhfkit dpo` / `rlhfkit reward`: the flags parse, reach the
trainer, and a run over TRL 1.x's data forms (implicit prompts, tokenised columns) trains and saves."""

from __future__ import annotations

import json

from rlhfkit.commands import dpo, reward
from rlhfkit.testing import tiny_model_path, tiny_tokenizer


def _write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _common(model, data, out):
    return [
        "--model_name_or_path", str(tiny_model_path(model)), "--dataset_name", str(data),
        "--output_dir", str(out), "--use_cpu", "--report_to", "none", "--save_strategy", "no",
        "--logging_steps", "1", "--max_steps", "2", "--per_device_train_batch_size", "4",
        "--disable_tqdm", "true",
    ]  # fmt: skip


def _summary(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_dpo_trl1_flags_on_implicit_prompt_data(tmp_path, capsys):
    rows = [{"chosen": f"Q{i}: yes good and fine", "rejected": f"Q{i}: no bad"} for i in range(8)]
    data = _write_jsonl(tmp_path / "pairs.jsonl", rows)
    flags = [
        "--use_weighting", "--ld_alpha", "0.5", "--sync_ref_model", "--ref_model_sync_steps", "1",
        "--ref_model_mixup_alpha", "0.5", "--pad_to_multiple_of", "8", "--pad_token", "<|endoftext|>",
        "--padding_free", "--max_length", "64",
    ]  # fmt: skip
    assert dpo.main(_common("llama", data, tmp_path / "out") + flags) == 0
    summary = _summary(capsys)
    assert summary["last_log"]["step"] == 2 and summary["last_log"]["rewards/margins"] > 0
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_dpo_tokenised_columns_and_precompute_batch_size(tmp_path, capsys):
    tok = tiny_tokenizer()
    rows = [
        {"prompt_ids": tok(f"Q{i}: ")["input_ids"], "chosen_ids": [20, 21, 0], "rejected_ids": [30, 0]}
        for i in range(8)
    ]
    data = _write_jsonl(tmp_path / "tokens.jsonl", rows)
    flags = ["--precompute_ref_log_probs", "--precompute_ref_batch_size", "8"]
    assert dpo.main(_common("llama", data, tmp_path / "out") + flags) == 0
    assert _summary(capsys)["last_log"]["step"] == 2


def test_dpo_bad_trl1_flag_values(tmp_path, capsys):
    data = _write_jsonl(tmp_path / "pairs.jsonl", [{"chosen": "a b", "rejected": "a c"}] * 4)
    assert dpo.main(_common("llama", data, tmp_path / "out") + ["--ld_alpha", "2"]) == 2
    assert "ld_alpha must be in [0, 1]" in capsys.readouterr().err


def test_reward_trl1_flags_on_tokenised_data(tmp_path, capsys):
    tok = tiny_tokenizer()
    rows = [{"chosen_ids": tok(f"Q{i} excellent")["input_ids"], "rejected_ids": tok(f"Q{i} bad")["input_ids"]}
            for i in range(8)]  # fmt: skip
    data = _write_jsonl(tmp_path / "tokens.jsonl", rows)
    flags = ["--pad_token", "<|assistant|>", "--eos_token", "<|endoftext|>", "--pad_to_multiple_of", "8"]
    assert reward.main(_common("llama-reward", data, tmp_path / "out") + flags) == 0
    assert "overlong" in _summary(capsys)
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["pad_token_id"] == 4  # <|assistant|>, from --pad_token
