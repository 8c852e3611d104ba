"""A checkpoint's manifest, and the checks that run before anything in a checkpoint is loaded.

`manifest.json` holds the format version, the step, and the sha256 and size of every other file; it is
written last, just before the folder is published. `verify_checkpoint` checks a folder against it, so a
truncated or altered file is named before it is read. A folder without one (written by plain transformers,
or altered) is refused: nothing in it can be checked, so garbage weights of the right size would load.
`trust_unverified_checkpoint=True` (every resume path takes it; every command `--trust_unverified_checkpoint`)
loads such a folder with a warning, after the parse checks of `validate_checkpoint`.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint folder is missing, incomplete, or a file in it does not match its manifest."""


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


def verify_checkpoint(path: str | os.PathLike, trust_unverified_checkpoint: bool = False) -> Path:
    """Check a checkpoint folder against its manifest before anything is loaded; return it.

    Raises CheckpointError naming the first missing, truncated or altered file. A folder without a
    manifest is refused, unless `trust_unverified_checkpoint`: then it only gets the parse checks of
    `validate_checkpoint`, with a warning.
    """
    folder = Path(path)
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        if not folder.is_dir() or not any(folder.iterdir()):
            return validate_checkpoint(folder)  # names a missing or empty folder
        if not trust_unverified_checkpoint:
            raise CheckpointError(
                f"checkpoint {str(folder)!r} has no {MANIFEST_FILE}, so none of its files can be verified "
                "(it was not written by rlhfkit, or was altered); resume from a checkpoint rlhfkit wrote, or "
                "pass trust_unverified_checkpoint=True (e.g. trainer.train(resume_from_checkpoint=..., "
                "trust_unverified_checkpoint=True); on the command line --trust_unverified_checkpoint) to "
                "load it as it is"
            )
        warnings.warn(
            f"loading the unverified checkpoint {str(folder)!r} (no {MANIFEST_FILE}; "
            "trust_unverified_checkpoint=True): a damaged or missing file is not detected",
            UserWarning,
            stacklevel=2,
        )
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
                f"checkpoint file {str(f)!r} is truncated or altered: {size} bytes, "
                f"the manifest says {entry['size']}"
            )
        if _sha256(f) != entry["sha256"]:
            raise CheckpointError(
                f"checkpoint file {str(f)!r} was altered: its sha256 does not match the manifest"
            )
    return folder


def validate_checkpoint(path: str | os.PathLike) -> Path:
    """Check that a checkpoint folder exists and that its files parse, before anything is loaded.

    A truncated or corrupt file raises a CheckpointError (a ValueError) naming it, instead of a parser
    error deep inside safetensors or torch. Cheap: JSON parsed, safetensors headers and zip directories
    read.
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
