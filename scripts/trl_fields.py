"""Write the names and defaults of TRL's config fields and trainer arguments: facts for the migration tables.

Run with a Python that has TRL installed (benchmarks/.venvs/trl-new has TRL 1.16):

    benchmarks/.venvs/trl-new/bin/python scripts/trl_fields.py \
        --out tests/compat/trl1_fields.json

Only names and values are recorded: each field as a config built with `output_dir` and
`use_cpu=True` holds it (defaults TRL fills in while building read as a user sees them). The tables in
docs/migrating_from_trl.md say, row by row, what rlhfkit does with each name, and
tests/compat/test_trl1_field_tables.py keeps the two in step.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import tempfile

PAIRS = ["GRPO", "RLOO", "DPO", "SFT", "Reward", "KTO"]


def _default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return _plain(field.default)
    if field.default_factory is not dataclasses.MISSING:
        return _plain(field.default_factory())
    return None


def _plain(value):
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    try:
        json.dumps(value)
    except TypeError:
        return repr(value)
    return value


def config_fields(config_cls) -> tuple[dict, dict]:
    """(the config's own fields, the TrainingArguments fields whose default it changes), name -> value.

    Values are those of a config built with nothing but `output_dir`, so defaults filled in when the
    config is built (TRL fills `generation_batch_size`, for one) read as a user sees them.
    """
    from transformers import TrainingArguments

    with tempfile.TemporaryDirectory() as folder:
        built = config_cls(output_dir=folder, use_cpu=True)
    base = {f.name: _default(f) for f in dataclasses.fields(TrainingArguments)}
    own, overrides = {}, {}
    for field in dataclasses.fields(config_cls):
        if not field.init:
            continue
        if field.name not in base:
            own[field.name] = _plain(getattr(built, field.name))
        elif _default(field) != base[field.name]:
            overrides[field.name] = _plain(getattr(built, field.name))
    return own, overrides


def trainer_arguments(trainer_cls) -> list[str]:
    return [name for name in inspect.signature(trainer_cls.__init__).parameters if name != "self"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    out = parser.parse_args().out
    import trl

    record = {"trl_version": trl.__version__, "trainers": {}}
    for name in PAIRS:
        own, overrides = config_fields(getattr(trl, f"{name}Config"))
        record["trainers"][name] = {
            "config": own,
            "changed_training_arguments": overrides,
            "arguments": trainer_arguments(getattr(trl, f"{name}Trainer")),
        }
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=1, sort_keys=True)
        handle.write("\n")


if __name__ == "__main__":
    main()
