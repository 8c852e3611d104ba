"""Resuming a run: does the resumed run still match the one that wrote the checkpoint?

Which checkpoint a `resume_from_checkpoint` value names is `checkpointing.checkpoint_to_resume`. Each
Trainer checkpoint also records the settings that shape the rest of the run (`SETTINGS_FILE`: batch size,
gradient accumulation, learning rate, seed, max_steps; PPO's checkpoints its own `PPO_WATCHED`);
`check_resume_settings` warns, one line per setting, when a resumed run changes one, and refuses a max_steps
below the checkpoint's step (nothing would be trained, and a final model would be written as if it had been).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

from rlhfkit.trainers.common.checkpoint_manifest import MANIFEST_FILE

SETTINGS_FILE = "training_settings.json"
# the settings a resumed run is compared on; a change makes it differ from the run that was interrupted
WATCHED = ("per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "seed")
# the same for a PPOConfig (its run length is `steps`)
PPO_WATCHED = ("batch_size", "mini_batch_size", "gradient_accumulation_steps", "ppo_epochs", "learning_rate",
               "seed")  # fmt: skip


class ResumeSettingsWarning(UserWarning):
    """A run resumed with a setting that differs from the one its checkpoint was written with."""


def write_training_settings(
    folder: str | os.PathLike, args: Any, watched: tuple[str, ...] = WATCHED, length: str = "max_steps"
) -> None:
    """Record `args`' `watched` settings and run length in a checkpoint folder (before its manifest)."""
    names = (*watched, length)
    settings = {n: getattr(args, n) for n in names if isinstance(getattr(args, n, None), (int, float))}
    (Path(folder) / SETTINGS_FILE).write_text(json.dumps(settings, indent=1), encoding="utf-8")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def checkpoint_step(folder: str | os.PathLike) -> int | None:
    """The step a checkpoint was written at (its manifest, else its trainer state), or None."""
    folder = Path(folder)
    places = ((MANIFEST_FILE, "step"), ("trainer_state.json", "global_step"), ("trainer_state.json", "step"))
    for name, key in places:
        value = _read_json(folder / name).get(key)
        if isinstance(value, int):
            return value
    return None


def check_resume_settings(
    folder: str | os.PathLike,
    args: Any = None,
    *,
    max_steps: int | None = None,
    max_steps_flag: str = "--max_steps",
    warn: bool = True,
    watched: tuple[str, ...] = WATCHED,
) -> None:
    """Before resuming from `folder`: a ValueError when the run would end before the checkpoint's step
    (`max_steps`, default `args.max_steps` when positive); with `warn`, one `ResumeSettingsWarning` line per
    `watched` setting of `args` that differs from the one recorded in the checkpoint."""
    folder = Path(folder)
    step = checkpoint_step(folder)
    if max_steps is None and args is not None and getattr(args, "max_steps", -1) > 0:
        max_steps = args.max_steps
    if step is not None and max_steps is not None and max_steps < step:
        raise ValueError(
            f"{max_steps_flag} {max_steps} is below the step of checkpoint {str(folder)!r} (step {step}): "
            f"nothing would be trained. Give {max_steps_flag} {step + 1} or more, or resume from an earlier "
            "checkpoint"
        )
    if not warn or args is None:
        return
    saved = _read_json(folder / SETTINGS_FILE)
    for name in watched:
        old, new = saved.get(name), getattr(args, name, None)
        if old is not None and new is not None and old != new:
            warnings.warn(
                f"resuming with --{name} {new}, but checkpoint {str(folder)!r} was written by a run with "
                f"--{name} {old}: the rest of the run will differ from the interrupted one",
                ResumeSettingsWarning,
                stacklevel=3,
            )
