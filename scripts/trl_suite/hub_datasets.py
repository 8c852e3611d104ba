"""Local stand-ins for `trl-internal-testing/zen`, the small dataset TRL's tests train on, for its
gpt-oss twin `harmony` (the same sentences as developer/user/assistant chats, replies with `thinking`),
and for the `toolcall` dataset, whose rows hub_toolcall.py writes.

Each config of the hub dataset (`standard_prompt_only`, `conversational_preference`, ...) is rebuilt
with the same columns and splits (17 train rows, 2 test rows) from short sentences of our own, written
once as parquet files; `load_dataset` then reads them with the real parquet loader, so split slicing
(`train[:2]`) and `streaming=True` behave as they do for the hub copy.
"""

from __future__ import annotations

from pathlib import Path

from hub_models import HarnessUnmapped, _root
from hub_toolcall import toolcall_split

from rlhfkit.testing.cache import publish_once

# (prompt, chosen completion); rejected completions are the chosen ones of the next row
TRAIN = [
    ("The sun", " rises in the east."), ("Water", " boils when it is hot enough."),
    ("A cat", " sleeps most of the day."), ("Rain", " makes the grass grow."),
    ("The moon", " circles the earth."), ("Bread", " is baked in an oven."),
    ("Birds", " build nests in spring."), ("Snow", " falls in the winter."),
    ("The river", " runs to the sea."), ("A good book", " is worth reading twice."),
    ("Music", " fills the quiet room."), ("The train", " leaves at noon."),
    ("Old trees", " have deep roots."), ("Fresh coffee", " smells wonderful."),
    ("The children", " play in the park."), ("A small boat", " drifts on the lake."),
    ("Stars", " shine at night."),
]  # fmt: skip
TEST = [("The wind", " blows from the north."), ("Honey", " is made by bees.")]


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Finish the sentence: {text}"}]


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text.strip()}]


def _standard_rows(config: str, prompt: str, chosen: str, rejected: str, index: int) -> dict:
    return {
        "language_modeling": {"text": prompt + chosen},
        "prompt_only": {"prompt": prompt},
        "prompt_completion": {"prompt": prompt, "completion": chosen},
        "preference": {"prompt": prompt, "chosen": chosen, "rejected": rejected},
        "implicit_prompt_preference": {"chosen": prompt + chosen, "rejected": prompt + rejected},
        "unpaired_preference": {
            "prompt": prompt, "completion": chosen if index % 2 == 0 else rejected, "label": index % 2 == 0
        },
        "stepwise_supervision": {
            "prompt": prompt, "completions": [chosen, rejected], "labels": [True, False]
        },
    }[config]  # fmt: skip


def _conversational_rows(config: str, prompt: str, chosen: str, rejected: str, index: int) -> dict:
    user, good, bad = _user(prompt), _assistant(chosen), _assistant(rejected)
    return {
        "language_modeling": {"messages": user + good},
        "prompt_only": {"prompt": user},
        "prompt_completion": {"prompt": user, "completion": good},
        "preference": {"prompt": user, "chosen": good, "rejected": bad},
        "implicit_prompt_preference": {"chosen": user + good, "rejected": user + bad},
        "unpaired_preference": {
            "prompt": user, "completion": good if index % 2 == 0 else bad, "label": index % 2 == 0
        },
    }[config]  # fmt: skip


def zen_split(name: str, pairs: list[tuple[str, str]]) -> list[dict]:
    """The rows of one split of zen config `name` (e.g. "conversational_preference")."""
    style, _, config = name.partition("_")
    make = {"standard": _standard_rows, "conversational": _conversational_rows}.get(style)
    rows = []
    for index, (prompt, chosen) in enumerate(pairs):
        rejected = pairs[(index + 1) % len(pairs)][1]
        try:
            rows.append(make(config, prompt, chosen, rejected, index))
        except (KeyError, TypeError):
            unknown = f"no local stand-in for dataset config trl-internal-testing/zen {name!r}"
            raise HarnessUnmapped(unknown) from None
    return rows


def _harmony_row(config: str, prompt: str, chosen: str, rejected: str) -> dict:
    """A zen sentence as gpt-oss chats are written: a developer instruction and an assistant reply with its
    `thinking` (the analysis channel), as in `trl-internal-testing/harmony`."""
    asked = [{"role": "developer", "content": "Finish sentences plainly."}, *_user(prompt)]

    def reply(text: str) -> list[dict]:
        thinking = f"The sentence starts with {prompt!r}."
        return [{"role": "assistant", "content": text.strip(), "thinking": thinking}]

    good, bad = reply(chosen), reply(rejected)
    return {
        "language_modeling": {"messages": asked + good},
        "prompt_completion": {"prompt": asked, "completion": good},
        "preference": {"prompt": asked, "chosen": good, "rejected": bad},
    }[config]


def harmony_split(name: str, pairs: list[tuple[str, str]]) -> list[dict]:
    """The rows of one split of harmony config `name` ("language_modeling", "prompt_completion",
    "preference")."""
    rows = []
    for index, (prompt, chosen) in enumerate(pairs):
        try:
            rows.append(_harmony_row(name, prompt, chosen, pairs[(index + 1) % len(pairs)][1]))
        except KeyError:
            unknown = f"no local stand-in for dataset config trl-internal-testing/harmony {name!r}"
            raise HarnessUnmapped(unknown) from None
    return rows


def _write(rows_of, out: Path) -> None:
    from datasets import Dataset

    for split in ("train", "test"):
        Dataset.from_list(rows_of(split)).to_parquet(str(out / f"{split}.parquet"))


def _zen_rows(name: str, split: str) -> list[dict]:
    return zen_split(name, {"train": TRAIN, "test": TEST}[split])


def _toolcall_rows(name: str, split: str) -> list[dict]:
    try:
        return toolcall_split(name, split)
    except KeyError:
        unknown = f"no local stand-in for dataset config trl-internal-testing/toolcall {name!r}"
        raise HarnessUnmapped(unknown) from None


def _harmony_rows(name: str, split: str) -> list[dict]:
    return harmony_split(name, {"train": TRAIN, "test": TEST}[split])


# hub dataset -> rows of (config, split); an unknown config raises HarnessUnmapped
_SOURCES = {
    "trl-internal-testing/zen": _zen_rows,
    "trl-internal-testing/toolcall": _toolcall_rows,
    "trl-internal-testing/harmony": _harmony_rows,
}


def local_dataset_files(path: str, name: str | None) -> dict[str, str]:
    """Parquet files per split standing in for hub dataset `path` with config `name`."""
    rows = _SOURCES.get(path)
    if rows is None or not name:
        raise HarnessUnmapped(f"no local stand-in for hub dataset {path!r} (config {name!r})")
    rows(name, "test")  # refuse unknown configs before writing anything
    folder = _root() / "datasets" / path.rpartition("/")[2] / name
    folder = publish_once(folder, "test.parquet", lambda out: _write(lambda split: rows(name, split), out))
    return {split: str(folder / f"{split}.parquet") for split in ("train", "test")}
