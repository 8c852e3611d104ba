"""Local dataset loading: every supported format, split handling, and the offline error for hub names."""

from __future__ import annotations

import json

import datasets
import pytest

from rlhfkit.data.loading import load_local_dataset, load_splits

ROWS = [{"chosen": "good", "rejected": "bad"}, {"chosen": "nice", "rejected": "awful"}]


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".csv", ".parquet"])
def test_file_formats(tmp_path, suffix):
    path = tmp_path / f"pairs{suffix}"
    ds = datasets.Dataset.from_list(ROWS)
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in ROWS))
    elif suffix == ".json":
        path.write_text(json.dumps(ROWS))
    elif suffix == ".csv":
        ds.to_csv(str(path), index=False)
    else:
        ds.to_parquet(str(path))
    loaded = load_local_dataset(str(path))
    assert list(loaded) == ["train"]
    assert loaded["train"]["chosen"] == ["good", "nice"]


def test_save_to_disk_folders(tmp_path):
    dsd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:1])}
    )
    dsd.save_to_disk(str(tmp_path / "dd"))
    train, evaluation = load_splits(str(tmp_path / "dd"))
    assert len(train) == 2 and len(evaluation) == 1
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "single"))
    train, evaluation = load_splits(str(tmp_path / "single"))
    assert len(train) == 2 and evaluation is None  # no test split: no evaluation


def test_hub_name_gives_offline_error():
    with pytest.raises(ValueError, match="offline"):
        load_local_dataset("someone/some-dataset")


def test_missing_split_is_named(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(ROWS[0]))
    with pytest.raises(ValueError, match="no split 'validation'"):
        load_splits(str(path), train_split="validation")


def test_unsupported_file(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("hi")
    with pytest.raises(ValueError, match="unsupported"):
        load_local_dataset(str(path))
