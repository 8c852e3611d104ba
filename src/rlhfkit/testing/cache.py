"""Where the tiny models live on disk, and how a folder is published without races.

Several test processes may ask for the same model at once. Each builds into its own hidden temp
folder next to the target and renames it into place; a rename onto a folder that already exists
fails, and the loser simply throws its copy away. A folder that exists is therefore always complete,
so a cache hit is one `stat` call.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

# Bump when the shipped corpus, the tokenizer recipe or any model config changes: old caches are
# left alone and everything is rebuilt under the new subfolder.
FORMAT_VERSION = 1


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Versioned folder holding the tokenizer and every tiny model.

    `cache_dir` wins, then `$RLHFKIT_CACHE`, then `~/.cache/rlhfkit`.
    """
    base = cache_dir if cache_dir is not None else os.environ.get("RLHFKIT_CACHE") or "~/.cache/rlhfkit"
    return Path(base).expanduser().resolve() / f"tiny-models-v{FORMAT_VERSION}"


def publish_once(final: Path, marker: str, build: Callable[[Path], None]) -> Path:
    """Return `final`, first calling `build(tmp_dir)` and renaming it into place if it is missing.

    `marker` is a file every finished folder contains; it is what a cache hit checks.
    """
    if (final / marker).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        build(tmp)
        if not (tmp / marker).is_file():
            raise RuntimeError(f"building {final.name} did not write {marker}")
        try:
            os.rename(tmp, final)
        except OSError as err:
            if err.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not (final / marker).is_file():
                raise
            # another process published first; its copy is identical, keep it
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
