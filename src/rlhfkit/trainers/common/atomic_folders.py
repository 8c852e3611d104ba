"""Folders written safely: published by renames only, and one run at a time in an output folder.

A folder is written under a dot-named temporary name next to its final one, fsynced, then renamed into
place (`atomic_directory`, `publish_directory`): a reader sees the old folder or the new one, never half
of one. A lock file in an output folder (owner pid and host, `lock_output_dir`) keeps a second run from
writing into it; a lock left by a dead process is taken over.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = ".rlhfkit.lock"


class CheckpointLockError(RuntimeError):
    """Another live run holds the output folder's lock."""


# ------------------------------------------------------------------ publishing by renames


def _fsync_tree(folder: Path) -> None:
    for f in folder.rglob("*"):  # flush file contents before a rename makes them visible
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


def recover_interrupted_replace(final: Path) -> None:
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
    recover_interrupted_replace(final)
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
    recover_interrupted_replace(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        publish_directory(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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
                    f"output_dir {str(root)!r} is in use by another run (pid {pid} on host {host}, "
                    f"lock file {str(lock)!r}); use another output_dir, or stop that run (delete the "
                    "lock if it is gone)"
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
