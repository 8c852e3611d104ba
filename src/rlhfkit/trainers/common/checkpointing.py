"""The one checkpoint format of every trainer: atomic `checkpoint-<step>` folders with checksums.

A checkpoint is written into a dot-named staging folder, gets a `manifest.json` (sha256 and size of each
file, format version, step), is fsynced, then renamed into place. Loading verifies the manifest, so a
truncated or altered file is named before anything is read; `latest_checkpoint` skips such a folder and falls
back to the newest intact one. A failed write (a full disk, on any process) removes the staging folder and
stops every process with `CheckpointWriteError`; the previous checkpoint is untouched. A lock file in the
output folder (owner pid and host) keeps two runs from writing into the same folder.

State other than weights is JSON plus safetensors (`save_state`/`load_state`): nothing is unpickled; each
process's random state is kept (`rng_state_<rank>`) and taken back by the process of that rank on resuming.

This module writes, lists, prunes and loads checkpoints; its parts live beside it and every name of the
format is importable from here:
  atomic_folders.py       publishing a folder by renames, the output folder's lock
  checkpoint_manifest.py  the manifest, and the checks before loading
  state_files.py          `save_state` / `load_state`
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file, save_model

from rlhfkit.trainers.common.atomic_folders import (
    LOCK_FILE,
    CheckpointLockError,
    atomic_directory,
    lock_output_dir,
    publish_directory,
    recover_interrupted_replace,
)
from rlhfkit.trainers.common.checkpoint_manifest import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    CheckpointError,
    validate_checkpoint,
    verify_checkpoint,
    write_manifest,
)
from rlhfkit.trainers.common.sharding import process_rank, rng_state, save_in_phases, set_rng_state
from rlhfkit.trainers.common.state_files import load_state, save_state

__all__ = [
    "CHECKPOINT_PREFIX",
    "FORMAT_VERSION",
    "LOCK_FILE",
    "MANIFEST_FILE",
    "RNG_NAME",
    "STATE_NAME",
    "WEIGHTS_FILE",
    "CheckpointError",
    "CheckpointLockError",
    "CheckpointWriteError",
    "as_write_error",
    "atomic_directory",
    "discard_staging",
    "finish_checkpoint",
    "is_disk_full",
    "latest_checkpoint",
    "list_checkpoints",
    "load_state",
    "load_training_checkpoint",
    "lock_output_dir",
    "peers_failed",
    "prune_checkpoints",
    "publish_directory",
    "resolve_checkpoint",
    "rng_state",
    "save_state",
    "save_training_checkpoint",
    "set_rng_state",
    "validate_checkpoint",
    "verify_checkpoint",
    "write_checkpoint",
    "write_manifest",
]

CHECKPOINT_PREFIX = "checkpoint-"
_CHECKPOINT_RE = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (e.g. the disk is full); the previous checkpoint is intact."""


# ------------------------------------------------------------------ writing, listing, retention


def _staging_folder(final: Path) -> Path:
    """`<parent>/.<name>.tmp-XXXX/<name>`: the inner folder has the final name (Trainer derives it)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    return root / final.name


def finish_checkpoint(staged: Path, final: Path, step: int) -> Path:
    """Manifest, fsync and atomic rename of a fully written staging folder; the staging root is removed."""
    try:
        write_manifest(staged, step)
        publish_directory(staged, final)
    except Exception as err:
        discard_staging(staged)
        raise as_write_error(err, final)  # noqa: B904 - a mapped error has `err` as its cause
    discard_staging(staged)
    return final


def discard_staging(staged: Path) -> None:
    shutil.rmtree(staged.parent if staged.parent.name.startswith(".") else staged, ignore_errors=True)


def peers_failed(staged: Path, final: Path) -> Callable[[list[int]], CheckpointWriteError]:
    """What every process does once some failed to write their part of `final`: discard it, raise this."""
    return lambda ranks: (
        discard_staging(staged)
        or CheckpointWriteError(
            errno.EIO,
            f"process(es) {ranks} failed to write their part of checkpoint {str(final)!r}; nothing was "
            "published, the previous checkpoint is intact",
        )
    )


# how writers report a full disk when it is not an OSError: safetensors' SafetensorError carries the Rust
# io::Error ("os error 28", "code: 28, kind: StorageFull"), torch's zip writer an enforce failure ("unexpected
# pos A vs B", "file write failed")
_DISK_FULL_TEXT = re.compile(
    r"no space left|os error 28|code: 28\b|storagefull|\benospc\b|errno 28\b|disk quota|"
    r"unexpected pos \d+ vs \d+|file write failed",
    re.IGNORECASE,
)


def is_disk_full(err: BaseException) -> bool:
    """Whether `err`, or an error it was raised from or while handling, says the disk (or quota) is full."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if _DISK_FULL_TEXT.search(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


def as_write_error(err: BaseException, final: Path) -> BaseException:
    """A full disk, however the writer reported it (see `is_disk_full`), becomes a CheckpointWriteError
    that names the folder and says what to do (caused by `err`); any other error is returned as it is."""
    if not is_disk_full(err):
        return err
    mapped = CheckpointWriteError(
        errno.ENOSPC,
        f"no space left on the device (the disk is full) while writing checkpoint {str(final)!r}: "
        f"{type(err).__name__}: {err}. The half-written copy was removed and the previous checkpoint is "
        "intact. Free disk space (or lower save_total_limit) and resume",
    )
    mapped.__cause__ = err
    return mapped


def write_checkpoint(final_dir: str | os.PathLike, write: Callable[[Path], None], step: int) -> Path:
    """`write(folder)` fills a staging folder, which then gets its manifest and replaces `final_dir`
    atomically."""
    final = Path(final_dir)
    recover_interrupted_replace(final)
    staged = _staging_folder(final)
    staged.mkdir()
    _fill(staged, final, write)
    return finish_checkpoint(staged, final, step)


def _fill(staged: Path, final: Path, write: Callable[[Path], None]) -> None:
    """`write(staged)`; on failure the staging folder goes (a full disk becomes a CheckpointWriteError)."""
    try:
        write(staged)
    except Exception as err:
        discard_staging(staged)
        raise as_write_error(err, final)  # noqa: B904 - a mapped error has `err` as its cause
    except BaseException:
        discard_staging(staged)
        raise


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The `checkpoint-<step>` folders in `output_dir`, oldest (lowest step) first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    for leftover in root.glob(f".{CHECKPOINT_PREFIX}*.old-*"):
        recover_interrupted_replace(root / leftover.name[1:].split(".old-")[0])
    found = [
        (int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _CHECKPOINT_RE.match(p.name))
    ]
    return [p for _, p in sorted(found)]


def latest_checkpoint(
    output_dir: str | os.PathLike, trust_unverified_checkpoint: bool = False
) -> Path | None:
    """The intact `checkpoint-<step>` folder with the highest step, or None; damaged ones (and ones without
    a manifest, unless `trust_unverified_checkpoint`) are skipped with a warning."""
    for folder in reversed(list_checkpoints(output_dir)):
        try:
            return verify_checkpoint(folder, trust_unverified_checkpoint)
        except (CheckpointError, OSError, json.JSONDecodeError, KeyError) as err:
            warnings.warn(f"skipping damaged checkpoint {str(folder)!r}: {err}", stacklevel=2)
    return None


def prune_checkpoints(output_dir: str | os.PathLike, keep: int | None, protect: tuple[str, ...] = ()) -> None:
    """Delete the oldest `checkpoint-<step>` folders so at most `keep` remain (None: keep all).

    Folders named in `protect` (e.g. the best model) are never deleted.
    """
    if keep is None:
        return
    folders = list_checkpoints(output_dir)
    kept = {Path(p).resolve() for p in protect if p}
    removable = [f for f in folders if f.resolve() not in kept]
    for old in removable[: max(0, len(folders) - max(keep, 1))]:
        shutil.rmtree(old, ignore_errors=True)


def checkpoint_to_resume(
    output_dir: str | os.PathLike, checkpoint: str | bool | None, trust_unverified_checkpoint: bool = False
) -> Path | None:
    """The verified folder a `resume_from_checkpoint` value names: True, the newest intact checkpoint of
    `output_dir` (an error when there is none); a path, that checkpoint folder, or the newest intact
    `checkpoint-<step>` of an output folder (`resolve_checkpoint`); None or False, None. The strings of a
    command line: "true" or "latest" (unless a folder has that name) mean True, "false", "none" and "" None.
    A path that does not exist or holds no checkpoint is a CheckpointError (a ValueError) naming it.
    `trust_unverified_checkpoint`: a folder without a manifest is taken too (with a warning)."""
    if isinstance(checkpoint, str) and not Path(checkpoint).expanduser().exists():
        word = checkpoint.strip().lower()
        if word in ("true", "latest", "false", "none", ""):
            checkpoint = word in ("true", "latest") or None
    if checkpoint is True:
        found = latest_checkpoint(output_dir, trust_unverified_checkpoint)
        if found is None:
            raise ValueError(
                f"resume_from_checkpoint=True but {output_dir} holds no intact checkpoint-* folder"
            )
        return found
    if not checkpoint:
        return None
    folder = Path(checkpoint).expanduser()
    looks_like_one = _CHECKPOINT_RE.match(folder.name) or any(
        (folder / name).is_file() for name in (MANIFEST_FILE, "trainer_state.json")
    )  # a damaged checkpoint is named by `resolve_checkpoint`
    if folder.is_dir() and not looks_like_one and not list_checkpoints(folder):
        raise CheckpointError(
            f"resume_from_checkpoint {str(checkpoint)!r} holds no checkpoint: it is neither a "
            "checkpoint-<step> folder nor an output folder with one"
        )
    return resolve_checkpoint(folder, trust_unverified_checkpoint)


def resolve_checkpoint(path: str | os.PathLike, trust_unverified_checkpoint: bool = False) -> Path:
    """A verified checkpoint folder: `path` itself, or the latest intact `checkpoint-<step>` folder
    inside it (`trust_unverified_checkpoint`: see `verify_checkpoint`)."""
    folder, trust = Path(path).expanduser(), trust_unverified_checkpoint
    if folder.is_dir() and not (folder / MANIFEST_FILE).is_file() and list_checkpoints(folder):
        found = latest_checkpoint(folder, trust)
        if found is not None:
            return found
        return verify_checkpoint(list_checkpoints(folder)[-1], trust)  # none intact: names the damage
    return verify_checkpoint(folder, trust)


# ------------------------------------------------------------------ a trainer's checkpoint

WEIGHTS_FILE = "model.safetensors"
STATE_NAME = "trainer_state"  # trainer_state.json + trainer_state.safetensors
RNG_NAME = "rng_state_{rank}"  # one per process (json + safetensors) when a checkpoint is written by several


def save_training_checkpoint(
    checkpoint_dir: str | os.PathLike,
    step: int,
    weights: torch.nn.Module | dict[str, torch.Tensor],
    parts: dict[str, Any],
    extra: dict[str, Any] | None = None,
    generators: dict[str, torch.Generator] | None = None,
    settings: Callable[[Path], None] | None = None,
) -> Path:
    """Write weights (a module, or a dict of tensors), the `state_dict()` of each of `parts` (None: skipped),
    `extra` counters and every generator's RNG, atomically, under the parent folder's lock; `settings(folder)`
    adds the run's settings (`resuming.write_training_settings`). Call it on every process (all see the
    output folder; each adds its `rng_state_<rank>`); one failing makes all raise at once."""
    (rank, world), final, rng = process_rank(), Path(checkpoint_dir), rng_state(generators)
    staged = final.parent / f".{final.name}.tmp-ranks" / final.name  # a name every process can find

    def write(folder: Path) -> None:
        if isinstance(weights, torch.nn.Module):
            save_model(weights, str(folder / WEIGHTS_FILE))  # handles tied weights
        else:
            save_file(
                {k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(folder / WEIGHTS_FILE)
            )
        state = {name: part.state_dict() if part is not None else None for name, part in parts.items()}
        state.update(extra or {}, step=int(step), rng=rng, num_processes=world)
        save_state(folder, STATE_NAME, state)
        if settings is not None:
            settings(folder)

    def start() -> None:
        lock_output_dir(final.parent)
        shutil.rmtree(staged.parent, ignore_errors=True)  # left by a crash; the lock keeps other runs out
        staged.mkdir(parents=True)
        _fill(staged, final, write)

    def add_rng() -> None:  # not `_fill`: this process must not discard the folder the others write in
        if not staged.is_dir():  # the main process made it: this one does not see the same output folder
            raise CheckpointWriteError(
                errno.ENOENT, f"process {rank} cannot see {str(staged)!r} (a shared disk?)"
            )
        try:
            save_state(staged, RNG_NAME.format(rank=rank), rng)
        except Exception as err:
            raise as_write_error(err, final)  # noqa: B904 - a mapped error has `err` as its cause

    save_in_phases(
        start, add_rng, lambda: finish_checkpoint(staged, final, step), peers_failed(staged, final)
    )
    return final


def _restore_rng(folder: Path, state: dict[str, Any], generators: dict[str, torch.Generator] | None) -> None:
    """Each process takes back its own random state; one the checkpoint has none for keeps its seeded one."""
    rank, world = process_rank()
    # checkpoints from before the per-process files hold the main process's state only
    saved = int(state.get("num_processes", 1))
    if saved != world and rank == 0:
        warnings.warn(
            f"checkpoint {str(folder)!r} holds the random state of {saved} process(es) and is resumed on "
            f"{world}: processes 0..{min(saved, world) - 1} restore theirs, any others keep their seeded "
            "one, so the run will not repeat the uninterrupted one exactly",
            stacklevel=3,
        )
    if rank < saved:
        set_rng_state(
            state["rng"] if saved == 1 else load_state(folder, RNG_NAME.format(rank=rank)), generators
        )


def load_training_checkpoint(
    path: str | os.PathLike,
    parts: dict[str, Any],
    generators: dict[str, torch.Generator] | None = None,
    trust_unverified_checkpoint: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """Verify a `save_training_checkpoint` folder (or the latest intact one under `path`), load each of
    `parts` and restore the RNG. Returns the folder (the caller loads `folder / WEIGHTS_FILE`) and the state.
    `trust_unverified_checkpoint`: a folder without a manifest loads too (with a warning).
    """
    folder = resolve_checkpoint(path, trust_unverified_checkpoint)
    if not (folder / f"{STATE_NAME}.json").is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(
            f"{str(folder)!r} is not an rlhfkit checkpoint (no {STATE_NAME}.json and {WEIGHTS_FILE}); "
            "checkpoints of rlhfkit before this format no longer load (see CHANGELOG.md)"
        )
    state = load_state(folder, STATE_NAME)
    for name, part in parts.items():
        if part is not None and state.get(name) is not None:
            part.load_state_dict(state[name])
    _restore_rng(folder, state, generators)
    return folder, state
