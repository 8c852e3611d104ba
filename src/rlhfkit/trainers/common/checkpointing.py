"""The one checkpoint format of every trainer: `checkpoint-<step>` folders, published atomically, with checksums.

A checkpoint is written into a dot-named staging folder, gets a `manifest.json` (sha256 and size of each
file, format version, step), is fsynced, then renamed into place. Loading verifies the manifest, so a
truncated or altered file is named before anything is read; `latest_checkpoint` skips such a folder and falls
back to the newest intact one. A failed write (a full disk, on any process) removes the staging folder and
stops every process with `CheckpointWriteError`; the previous checkpoint is untouched. A lock file in the
output folder (owner pid and host) keeps two runs from writing into the same folder.

State other than weights is JSON plus safetensors (`save_state`/`load_state`): nothing is unpickled; each process's
random state is kept (`rng_state_<rank>`) and taken back by the process of that rank on resuming.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file, save_model

from rlhfkit.trainers.common.sharding import process_rank, rng_state, save_in_phases, set_rng_state  # noqa: F401 (rng_*: API)

CHECKPOINT_PREFIX = "checkpoint-"
MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1
LOCK_FILE = ".rlhfkit.lock"
_CHECKPOINT_RE = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint folder is missing, incomplete, or a file in it does not match its manifest."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (e.g. the disk is full); the previous checkpoint is intact."""


class CheckpointLockError(RuntimeError):
    """Another live run holds the output folder's lock."""


# ------------------------------------------------------------------ atomic folders


def _fsync_tree(folder: Path) -> None:
    for f in folder.rglob("*"):  # flush file contents before a rename makes them visible
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


def _recover_interrupted_replace(final: Path) -> None:
    """Undo a crash between the two renames of `publish_directory`: the old copy goes back into place."""
    if final.exists():
        return
    leftovers = sorted(final.parent.glob(f".{final.name}.old-*"), key=lambda p: p.stat().st_mtime)
    if leftovers:
        os.replace(leftovers[-1], final)


def publish_directory(staged: str | os.PathLike, final_dir: str | os.PathLike) -> Path:
    """Move a fully written folder to `final_dir`, replacing any previous one, by renames only.

    A crash at any point leaves either the old or the new folder readable under `final_dir`
    (a crash between the two renames is undone by the next save or `latest_checkpoint`).
    """
    staged, final = Path(staged), Path(final_dir)
    _fsync_tree(staged)
    _recover_interrupted_replace(final)
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(staged, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


@contextlib.contextmanager
def atomic_directory(final_dir: str | os.PathLike) -> Iterator[Path]:
    """Write a folder atomically: files go to a temp folder that is renamed into place.

    A crash mid-write leaves any previous `final_dir` untouched; a reader never sees half a folder.
    """
    final = Path(final_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    _recover_interrupted_replace(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        publish_directory(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ------------------------------------------------------------------ manifest


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: str | os.PathLike, step: int) -> None:
    """Record the sha256 and size of every file in `folder` (written last, just before publishing)."""
    folder = Path(folder)
    files = {
        f.relative_to(folder).as_posix(): {"sha256": _sha256(f), "size": f.stat().st_size}
        for f in sorted(folder.rglob("*"))
        if f.is_file() and f.name != MANIFEST_FILE
    }
    manifest = {"format_version": FORMAT_VERSION, "step": int(step), "files": files}
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1), encoding="utf-8")


def verify_checkpoint(path: str | os.PathLike) -> Path:
    """Check a checkpoint folder against its manifest before anything is loaded; return it.

    Raises CheckpointError naming the first missing, truncated or altered file. A folder without a
    manifest (written by plain transformers) only gets the parse checks of `validate_checkpoint`.
    """
    folder = Path(path)
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        return validate_checkpoint(folder)
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        manifest["files"].items()
    except (ValueError, KeyError, AttributeError) as err:
        raise CheckpointError(
            f"checkpoint file {str(manifest_path)!r} is corrupt or truncated ({err})"
        ) from err
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {str(folder)!r} has format version {manifest.get('format_version')!r}; "
            f"this rlhfkit reads version {FORMAT_VERSION}"
        )
    for name, entry in manifest["files"].items():
        f = folder / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint file {str(f)!r} is missing (listed in {MANIFEST_FILE})")
        size = f.stat().st_size
        if size != entry["size"]:
            raise CheckpointError(
                f"checkpoint file {str(f)!r} is truncated or altered: {size} bytes, the manifest says {entry['size']}"
            )
        if _sha256(f) != entry["sha256"]:
            raise CheckpointError(
                f"checkpoint file {str(f)!r} was altered: its sha256 does not match the manifest"
            )
    return folder


def validate_checkpoint(path: str | os.PathLike) -> Path:
    """Check that a checkpoint folder exists and that its files parse, before anything is loaded.

    A truncated or corrupt file raises a CheckpointError (a ValueError) naming it, instead of a parser
    error deep inside safetensors or torch. Cheap: JSON parsed, safetensors headers and zip directories read.
    """
    import zipfile

    from safetensors import safe_open

    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {str(folder)!r} does not exist or is not a folder")
    if not any(folder.iterdir()):
        raise CheckpointError(f"checkpoint {str(folder)!r} is empty")
    for f in sorted(folder.rglob("*")):
        if not f.is_file():
            continue
        try:
            if f.suffix == ".json":
                json.loads(f.read_text(encoding="utf-8"))
            elif f.suffix == ".safetensors":
                with safe_open(str(f), framework="pt") as fh:
                    fh.keys()
            elif f.suffix in (".pt", ".pth", ".bin"):  # torch.save writes zip archives
                with zipfile.ZipFile(f) as zf:
                    zf.namelist()
        except Exception as err:  # noqa: BLE001 - any parse failure means the same thing here
            raise CheckpointError(
                f"checkpoint file {str(f)!r} is corrupt or truncated ({type(err).__name__}: {err}); "
                "resume from an earlier checkpoint-* folder"
            ) from err
    return folder


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
    except OSError as err:
        discard_staging(staged)
        raise as_write_error(err, final) from err
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


def as_write_error(err: OSError, final: Path) -> OSError:
    """ENOSPC becomes a CheckpointWriteError that says what happened and what to do; other errors pass."""
    if err.errno != errno.ENOSPC:
        return err
    return CheckpointWriteError(
        errno.ENOSPC,
        f"no space left on the device while writing checkpoint {str(final)!r}; the half-written copy was "
        "removed and the previous checkpoint is intact. Free disk space (or lower save_total_limit) and "
        "resume",
    )


def write_checkpoint(final_dir: str | os.PathLike, write: Callable[[Path], None], step: int) -> Path:
    """`write(folder)` fills a staging folder, which then gets its manifest and replaces `final_dir` atomically."""
    final = Path(final_dir)
    _recover_interrupted_replace(final)
    staged = _staging_folder(final)
    staged.mkdir()
    _fill(staged, final, write)
    return finish_checkpoint(staged, final, step)


def _fill(staged: Path, final: Path, write: Callable[[Path], None]) -> None:
    """`write(staged)`; on failure the staging folder goes (ENOSPC becomes a CheckpointWriteError)."""
    try:
        write(staged)
    except OSError as err:
        discard_staging(staged)
        raise as_write_error(err, final) from err
    except BaseException:
        discard_staging(staged)
        raise


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The `checkpoint-<step>` folders in `output_dir`, oldest (lowest step) first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    for leftover in root.glob(f".{CHECKPOINT_PREFIX}*.old-*"):
        _recover_interrupted_replace(root / leftover.name[1:].split(".old-")[0])
    found = [
        (int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _CHECKPOINT_RE.match(p.name))
    ]
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The intact `checkpoint-<step>` folder with the highest step, or None; damaged ones are skipped with a warning."""
    for folder in reversed(list_checkpoints(output_dir)):
        try:
            return verify_checkpoint(folder)
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


# ------------------------------------------------------------------ output folder lock

_HELD_LOCKS: set[Path] = set()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def lock_output_dir(output_dir: str | os.PathLike) -> Path:
    """Take `output_dir`'s lock for this process (idempotent). A lock left by a dead process is taken over.

    Raises CheckpointLockError naming the other run's pid and host when it is still alive (or on
    another host, where liveness cannot be checked). Released at interpreter exit.
    """
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    lock = root / LOCK_FILE
    me = {"pid": os.getpid(), "host": socket.gethostname()}
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        try:
            owner = json.loads(lock.read_text(encoding="utf-8"))
            pid, host = int(owner["pid"]), str(owner["host"])
        except (OSError, ValueError, KeyError, TypeError):
            pid, host = -1, me["host"]  # unreadable: left by a crash while writing it
        if (pid, host) != (me["pid"], me["host"]):
            if host != me["host"] or (pid > 0 and _pid_alive(pid)):
                raise CheckpointLockError(
                    f"output_dir {str(root)!r} is in use by another run (pid {pid} on host {host}, lock file "
                    f"{str(lock)!r}); use another output_dir, or stop that run (delete the lock if it is gone)"
                ) from None
            warnings.warn(
                f"taking over the stale lock {str(lock)!r} of process {pid}, which is gone", stacklevel=2
            )
            tmp = lock.with_name(f"{LOCK_FILE}.{me['pid']}")
            tmp.write_text(json.dumps(me), encoding="utf-8")
            os.replace(tmp, lock)
    else:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(me, fh)
    _HELD_LOCKS.add(lock)
    return lock


@atexit.register
def _release_locks() -> None:
    for lock in list(_HELD_LOCKS):
        with contextlib.suppress(OSError, ValueError, KeyError):
            if json.loads(lock.read_text(encoding="utf-8"))["pid"] == os.getpid():
                lock.unlink()
        _HELD_LOCKS.discard(lock)


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A verified checkpoint folder: `path` itself, or the latest intact `checkpoint-<step>` folder inside it."""
    folder = Path(path).expanduser()
    if folder.is_dir() and not (folder / MANIFEST_FILE).is_file() and list_checkpoints(folder):
        found = latest_checkpoint(folder)
        return (
            found if found is not None else verify_checkpoint(list_checkpoints(folder)[-1])
        )  # names the damage
    return verify_checkpoint(folder)


# ------------------------------------------------------------------ JSON + safetensors state


def _encode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = value.detach().cpu().contiguous()
        return {"__tensor__": key}
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {"__dict__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, tensors) for v in value]}
    if isinstance(value, list):
        return [_encode(v, tensors) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(
        f"cannot store a {type(value).__name__} in a checkpoint (tensors, numbers, str, containers only)"
    )


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        return tensors[value["__tensor__"]]
    if "__ndarray__" in value:
        return np.asarray(value["__ndarray__"], dtype=value["dtype"])
    if "__tuple__" in value:
        return tuple(_decode(v, tensors) for v in value["__tuple__"])
    return {_decode(k, tensors): _decode(v, tensors) for k, v in value["__dict__"]}


def save_state(folder: str | os.PathLike, name: str, state: Any) -> None:
    """Write nested dicts/lists of tensors and numbers as `<name>.json` + `<name>.safetensors` (no pickle)."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _encode(state, tensors)
    save_file(tensors, str(Path(folder) / f"{name}.safetensors"))
    (Path(folder) / f"{name}.json").write_text(json.dumps(skeleton), encoding="utf-8")


def load_state(folder: str | os.PathLike, name: str) -> Any:
    """Inverse of `save_state`."""
    tensors = load_file(str(Path(folder) / f"{name}.safetensors"))
    return _decode(json.loads((Path(folder) / f"{name}.json").read_text(encoding="utf-8")), tensors)


# ------------------------------------------------------------------ a trainer's checkpoint: weights + state + RNG

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
) -> Path:
    """Write weights (a module, or a dict of tensors), the `state_dict()` of each of `parts` (None: skipped),
    `extra` counters and every generator's RNG, atomically, under the parent folder's lock. Call it on every
    process (all see the output folder; each adds its `rng_state_<rank>`); one failing makes all raise at once."""
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
        except OSError as err:
            raise as_write_error(err, final) from err

    save_in_phases(
        start, add_rng, lambda: finish_checkpoint(staged, final, step), peers_failed(staged, final)
    )
    return final


def _restore_rng(folder: Path, state: dict[str, Any], generators: dict[str, torch.Generator] | None) -> None:
    """Each process takes back its own random state; one the checkpoint has none for keeps its seeded one."""
    rank, world = process_rank()
    saved = int(
        state.get("num_processes", 1)
    )  # checkpoints before per-process files: the main process's only
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
    path: str | os.PathLike, parts: dict[str, Any], generators: dict[str, torch.Generator] | None = None
) -> tuple[Path, dict[str, Any]]:
    """Verify a `save_training_checkpoint` folder (or the latest intact one under `path`), load each of
    `parts` and restore the RNG. Returns the folder (the caller loads `folder / WEIGHTS_FILE`) and the state.
    """
    folder = resolve_checkpoint(path)
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
