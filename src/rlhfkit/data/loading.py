"""Load a dataset from a local path: the machine is offline, so hub names are refused with a clear hint.

Accepted: a .json / .jsonl / .csv / .parquet file, a folder of such files, or a folder written by
`Dataset.save_to_disk` / `DatasetDict.save_to_disk`.
"""

from __future__ import annotations

from pathlib import Path

_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


MODEL_HINT = "Pass a folder with config.json and weights (build tiny ones with `rlhfkit tiny-models`)"
DATASET_HINT = (
    "Pass a local file (.json, .jsonl, .csv, .parquet), a folder of such files, or a folder written by "
    "datasets' save_to_disk, e.g. --dataset_name ./data/pairs.jsonl"
)


def offline_error(what: str, value: str, hint: str = MODEL_HINT, kind: str = "folder") -> ValueError:
    """The one error for a name that is not on disk: every loader refuses hub names the same way."""
    return ValueError(
        f"{what} {value!r} is not a local {kind}; rlhfkit runs offline and downloads nothing. {hint}"
    )


def load_local_dataset(name_or_path: str):
    """Return a `datasets.DatasetDict` (file formats get a single 'train' split)."""
    import datasets

    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise offline_error("dataset", name_or_path, DATASET_HINT, kind="path")
    if path.is_dir():
        if (path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists():
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.Dataset):
                loaded = datasets.DatasetDict({"train": loaded})
            return loaded
        files = sorted(p for p in path.iterdir() if p.suffix in _FORMATS)
        kinds = {_FORMATS[p.suffix] for p in files}
        if not files or len(kinds) != 1:
            raise ValueError(
                f"folder {str(path)!r} is neither a save_to_disk folder nor a folder of files of one format "
                f"({', '.join(sorted(_FORMATS))}); found {sorted(p.name for p in path.iterdir())[:10]}"
            )
        return datasets.load_dataset(kinds.pop(), data_files={"train": [str(p) for p in files]})
    fmt = _FORMATS.get(path.suffix)
    if fmt is None:
        raise ValueError(
            f"unsupported dataset file {str(path)!r}: expected one of {', '.join(sorted(_FORMATS))}"
        )
    return datasets.load_dataset(fmt, data_files={"train": str(path)})


def load_splits(name_or_path: str, train_split: str = "train", test_split: str | None = "test"):
    """(train_dataset, eval_dataset or None) from a local dataset; a missing test split just means no eval."""
    dsd = load_local_dataset(name_or_path)
    if train_split not in dsd:
        raise ValueError(
            f"dataset {name_or_path!r} has no split {train_split!r} (available: {sorted(dsd)}); "
            "choose one with --dataset_train_split"
        )
    evaluation = dsd[test_split] if test_split and test_split in dsd else None
    return dsd[train_split], evaluation
