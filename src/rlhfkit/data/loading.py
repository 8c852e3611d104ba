"""Load a dataset from a local path: the machine is offline, so hub names are refused with a clear hint.

Accepted: a .json / .jsonl / .csv / .parquet file, a folder of such files, or a folder written by
`Dataset.save_to_disk` / `DatasetDict.save_to_disk`. A file that cannot be read (empty, a malformed line,
not the format its extension says) is a ValueError naming the file and, where it can be found, the line.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


MODEL_HINT = "Pass a folder with config.json and weights (build tiny ones with `rlhfkit tiny-models`)"
DATASET_HINT = (
    "Pass a local file (.json, .jsonl, .csv, .parquet), a folder of such files, or a folder written by "
    "datasets' save_to_disk, e.g. --dataset_name ./data/pairs.jsonl"
)


def is_model_name(text: str) -> bool:
    """ "org/name" as the hub spells a model (loadable offline once it is in the local hub cache), as
    opposed to a path of ours ("./x", "/x", "~/x", "a/b/c")."""
    return text.count("/") == 1 and not text.startswith((".", "/", "~")) and "\\" not in text


def offline_error(what: str, value: str, hint: str = MODEL_HINT, kind: str = "folder") -> ValueError:
    """The one error for a name that is not on disk: every loader refuses hub names the same way."""
    return ValueError(
        f"{what} {value!r} is not a local {kind}; rlhfkit runs offline and downloads nothing. {hint}"
    )


def _json_problem(text: str) -> str | None:
    """What is wrong with a JSON / JSON-lines text, or None when nothing is found."""
    lines = text.splitlines()
    first = next((line for line in lines if line.strip()), "")
    try:
        json.loads(first)
        whole = first.lstrip().startswith("[")
    except json.JSONDecodeError:
        whole = True  # one pretty-printed document (or a first line that is already broken)
    if whole:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as err:
            return f"is not valid JSON: line {err.lineno}, column {err.colno} ({err.msg})"
        rows = doc if isinstance(doc, list) else [doc]
        bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
        return None if bad is None else f"is not a list of JSON objects (item {bad} is not an object)"
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            return f"is not valid JSON lines: line {number}, column {err.colno} ({err.msg})"
        if not isinstance(row, dict):
            return f"is not valid JSON lines: line {number} is not a JSON object"
    return None


def _csv_problem(text: str) -> str | None:
    reader = csv.reader(io.StringIO(text))
    header, rows = next(reader, None), 0
    for row in reader:
        if not row:
            continue
        rows += 1
        if header is not None and len(row) > len(header):
            return f"is not valid CSV: line {reader.line_num} has {len(row)} fields, the header {len(header)}"
    return "has a header line but no rows" if rows == 0 else None


def _file_problem(fmt: str, path: Path) -> str | None:
    """What is wrong with one data file, found by reading it again (only after the loader failed)."""
    data = path.read_bytes()
    if not data.strip():
        return "is empty"
    if fmt == "parquet":
        return None if data[:4] == b"PAR1" else "is not a parquet file (it does not start with PAR1)"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"is not UTF-8 text (byte {err.start})"
    return _json_problem(text) if fmt == "json" else _csv_problem(text)


def _load_files(fmt: str, files: list[Path], shown: Path):
    """`datasets.load_dataset(fmt)` over `files`; its parse errors become a ValueError naming the file."""
    import datasets
    from datasets.exceptions import DatasetGenerationError
    from pyarrow import ArrowException

    # a parse error, an empty file (StopIteration) or a header without rows ("corresponds to no data")
    unreadable = (DatasetGenerationError, StopIteration, ValueError, ArrowException)
    # datasets logs each parse failure itself; the ValueError below says it once, naming file and line
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        return datasets.load_dataset(fmt, data_files={"train": [str(p) for p in files]})
    except unreadable as err:
        for file in files:
            problem = _file_problem(fmt, file)
            if problem is not None:
                raise ValueError(f"dataset file {str(file)!r} {problem}") from err
        cause = " ".join(str(err.__cause__ or err).split())[:300] or type(err).__name__
        raise ValueError(f"cannot read dataset {str(shown)!r} as {fmt}: {cause}") from err
    finally:
        datasets.logging.set_verbosity(verbosity)


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
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in _FORMATS)
        kinds = {_FORMATS[p.suffix.lower()] for p in files}
        if not files or len(kinds) != 1:
            raise ValueError(
                f"folder {str(path)!r} is neither a save_to_disk folder nor a folder of files of one format "
                f"({', '.join(sorted(_FORMATS))}); found {sorted(p.name for p in path.iterdir())[:10]}"
            )
        return _load_files(kinds.pop(), files, path)
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(
            f"unsupported dataset file {str(path)!r}: expected one of {', '.join(sorted(_FORMATS))}"
        )
    return _load_files(fmt, [path], path)


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
