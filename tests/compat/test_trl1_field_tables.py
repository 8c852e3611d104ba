"""The TRL 1.x tables of docs/migrating_from_trl.md say the truth about rlhfkit's configs and trainers.

`tests/compat/trl1_fields.json` lists, as facts, every field TRL 1.16's configs add to
`TrainingArguments` (with its default), the `TrainingArguments` defaults they change, and every
argument of their trainers (written by `scripts/trl_fields.py` from an installed TRL). The migration
page has one table per trainer with a row for each of them, marked `works`, `differs: how` or
`not offered: why`. This test keeps the rows honest: a row that works names a field rlhfkit has with
TRL's default, one that differs names a field rlhfkit has, one not offered names a field rlhfkit lacks,
and no TRL name is left out of its table.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from pathlib import Path

import pytest

import rlhfkit
from rlhfkit.trainers.rloo.current import GroupRLOOTrainer

ROOT = Path(__file__).resolve().parents[2]
FACTS = json.loads((ROOT / "tests/compat/trl1_fields.json").read_text("utf-8"))
PAGE = ROOT / "docs/migrating_from_trl.md"
ROW = re.compile(r"^\| `(?P<name>[A-Za-z_0-9]+)` \| (?P<kind>field|default|argument) \| (?P<status>.+?) \|$")
STATUSES = ("works", "differs: ", "not offered: ")
KINDS = {"field": "config", "default": "changed_training_arguments", "argument": "arguments"}


def tables() -> dict[str, dict[tuple[str, str], str]]:
    """Trainer name -> {(kind, TRL name): status text}, from the page's `### <Name>Trainer` tables."""
    found: dict[str, dict[tuple[str, str], str]] = {}
    current = None
    for line in PAGE.read_text("utf-8").splitlines():
        heading = re.match(r"^### `(\w+)Trainer` and `\w+Config` in TRL 1\.x$", line)
        if heading:
            current = found.setdefault(heading.group(1), {})
        elif line.startswith("#"):
            current = None
        elif current is not None and (row := ROW.match(line)):
            key = (row["kind"], row["name"])
            assert key not in current, f"{key} appears twice in the {line} table"
            current[key] = row["status"]
    return found


TABLES = tables()


def _normal(value):
    """Compare defaults as JSON stores them (tuples are lists, non-finite floats their repr)."""
    if isinstance(value, tuple):
        return [_normal(v) for v in value]
    if isinstance(value, float) and (value != value or abs(value) == float("inf")):
        return repr(value)
    return value


def our_config(trainer: str, tmp_path: Path):
    config = getattr(rlhfkit, f"{trainer}Config")(output_dir=str(tmp_path))
    if trainer == "RLOO":
        config.settle("current")  # TRL 1.x's RLOO is the current form
    return config


def accepted_arguments(trainer: str) -> set[str]:
    """Keyword names the trainer takes, following **kwargs up its base classes."""
    cls = GroupRLOOTrainer if trainer == "RLOO" else getattr(rlhfkit, f"{trainer}Trainer")
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters.values()
        names |= {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)} - {"self"}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


@pytest.mark.parametrize("trainer", sorted(FACTS["trainers"]))
def test_every_trl_name_has_one_row_and_no_other_rows(trainer):
    assert trainer in TABLES, f"docs/migrating_from_trl.md has no table for {trainer}Trainer"
    facts = FACTS["trainers"][trainer]
    expected = {(kind, name) for kind, key in KINDS.items() for name in facts[key]}
    rows = set(TABLES[trainer])
    assert not expected - rows, f"{trainer}: TRL names without a row: {sorted(expected - rows)}"
    assert not rows - expected, f"{trainer}: rows that are not TRL 1.16 names: {sorted(rows - expected)}"
    bad = {key: s for key, s in TABLES[trainer].items() if not s.startswith(STATUSES)}
    assert not bad, f"{trainer}: a status must start with one of {STATUSES}: {bad}"


@pytest.mark.parametrize("trainer", sorted(FACTS["trainers"]))
def test_config_rows_say_what_the_config_does(trainer, tmp_path):
    config = our_config(trainer, tmp_path)
    ours = {f.name for f in dataclasses.fields(config)}
    facts = FACTS["trainers"][trainer]
    wrong = []
    for (kind, name), status in TABLES[trainer].items():
        if kind == "argument":
            continue
        offered = name in ours
        if status.startswith("not offered") == offered:
            has = "has" if offered else "lacks"
            wrong.append(f"{name}: the row says {status[:12]!r} but the config {has} it")
        elif status == "works":
            trl_default = facts[KINDS[kind]][name]
            ours_default = getattr(config, name)
            if _normal(ours_default) != trl_default:
                wrong.append(f"{name}: 'works' but rlhfkit's {ours_default!r} != TRL's {trl_default!r}")
    assert not wrong, f"{trainer}:\n" + "\n".join(wrong)


@pytest.mark.parametrize("trainer", sorted(FACTS["trainers"]))
def test_argument_rows_say_what_the_trainer_takes(trainer):
    takes = accepted_arguments(trainer)
    wrong = [
        f"{name}: the row says {status[:12]!r} but the trainer {'takes' if name in takes else 'lacks'} it"
        for (kind, name), status in TABLES[trainer].items()
        if kind == "argument" and status.startswith("not offered") == (name in takes)
    ]
    assert not wrong, f"{trainer}:\n" + "\n".join(wrong)
