"""Completion tables by step: appended to samples.jsonl with step and table, never twice, and to
TensorBoard."""

from __future__ import annotations

import json
import math

import pytest

from rlhfkit.rewards import KeywordReward
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.trainers.common.progress import markdown_table, save_samples
from rlhfkit.trainers.grpo.config import GRPOConfig
from rlhfkit.trainers.grpo.trainer import GRPOTrainer


def count_e(completions, **kwargs):
    return KeywordReward("e")(completions)


def length(completions, **kwargs):
    return [float(len(c)) for c in completions]


def _rows(folder):
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


def test_tables_append_with_their_step_and_a_written_step_is_not_repeated(tmp_path):
    assert save_samples(tmp_path, 1, ["p1", "p2"], ["a", "b"], [1.0, 2.0])
    assert save_samples(tmp_path, 2, ["p1"], ["c"], [math.nan], columns={"extra": ["x"]})
    assert not save_samples(tmp_path, 1, ["p1"], ["again"], [9.0])  # step 1 of this table is already there
    assert save_samples(tmp_path, 1, ["p1"], ["d"], [0.5], table="win_rate")  # another table, same step
    rows = _rows(tmp_path)
    assert [(r["table"], r["step"], r["response"]) for r in rows] == [
        ("samples", 1, "a"),
        ("samples", 1, "b"),
        ("samples", 2, "c"),
        ("win_rate", 1, "d"),
    ]
    assert rows[2]["score"] is None and rows[2]["extra"] == "x"  # NaN (a reward that abstained) -> null
    csv_lines = (tmp_path / "samples.csv").read_text().splitlines()
    assert csv_lines[0] == "step,query,response,score,table" and len(csv_lines) == 5
    with pytest.raises(ValueError, match=r"columns\['extra'\] has 2 values for 1 rows"):
        save_samples(tmp_path, 3, ["p"], ["r"], [0.0], columns={"extra": ["x", "y"]})
    assert markdown_table(rows[:1]) == "| query | response | score |\n|---|---|---|\n| p1 | a | 1.0000 |"


def _grpo(output_dir, **kwargs) -> GRPOTrainer:
    config = dict(
        output_dir=str(output_dir), report_to="none", use_cpu=True, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=4, max_steps=3, logging_steps=1, save_strategy="steps",
        save_steps=2, disable_tqdm=True, seed=3, learning_rate=1e-3, lr_scheduler_type="constant",
        log_completions=True, num_completions_to_print=2,
    )  # fmt: skip
    config.update(kwargs)
    return GRPOTrainer(
        tiny_model("llama"),
        [count_e, length],
        args=GRPOConfig(**config),
        train_dataset=toy_prompt_dataset(n=16),
        processing_class=tiny_tokenizer(padding_side="left"),
    )


def test_completion_tables_accumulate_over_steps_and_survive_a_resume_without_duplicates(tmp_path):
    out = tmp_path / "out"
    _grpo(out).train()  # updates 0, 1, 2 logged; checkpoint-2 saved; then "crashes" after update 2
    first = _rows(out)
    assert [r["step"] for r in first] == [0, 0, 1, 1, 2, 2] and {r["table"] for r in first} == {"completions"}
    assert {"score/count_e", "score/length"} <= set(first[0])  # each reward function's score
    assert first[0]["score"] == pytest.approx(first[0]["score/count_e"] + first[0]["score/length"])

    _grpo(out, max_steps=4).train(resume_from_checkpoint=str(out / "checkpoint-2"))  # updates 2 and 3 again
    rows = _rows(out)
    assert rows[: len(first)] == first  # nothing rewritten: update 2's rows from before stay
    assert [r["step"] for r in rows] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_tables_are_written_to_tensorboard_as_text(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "out"
    _grpo(out, report_to="tensorboard", save_strategy="no", max_steps=2).train()
    (events,) = list(out.rglob("events.out.tfevents.*"))
    accumulator = EventAccumulator(str(events), size_guidance={"tensors": 0}).Reload()
    texts = accumulator.Tensors("samples/completions/text_summary")
    assert [t.step for t in texts] == [0, 1]
    written = texts[1].tensor_proto.string_val[0].decode()
    rows = [r for r in _rows(out) if r["step"] == 1]
    assert written.startswith("| query | response | score | score/count_e | score/length |")
    assert all(r["response"].replace("|", "\\|").replace("\n", "<br>") in written for r in rows)
