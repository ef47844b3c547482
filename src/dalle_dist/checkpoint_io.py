"""Reading and writing single-file checkpoints safely.

Writing: one torch.save of plain types and tensors, atomically (temporary file, fsync,
rename). Reading: torch.load(weights_only=True) only, so a file carrying pickled objects
is refused before any of its code can run.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

import torch

from dalle_dist.errors import CheckpointError
from dalle_dist.fileio import atomic_writer

FORMAT_VERSION = 1


HISTORY_PATTERN = re.compile(r"step-(\d+)\.pt$")


def write_checkpoint_file(path: str | Path, payload: dict[str, Any]) -> None:
    with atomic_writer(path) as f:
        torch.save(payload, f)


def history_dir(path: str | Path) -> Path:
    """`dalle.pt` -> `dalle-checkpoints/`, where --keep_n_checkpoints keeps earlier saves."""
    path = Path(path)
    return path.with_name(f"{path.stem}-checkpoints")


def keep_history(path: str | Path, step: int, keep_n: int) -> Path:
    """Keep the file just written at `path` as history/step-N.pt; drop all but the newest N.

    A hard link costs no copy (`path` is replaced by rename at the next save, so the link
    keeps this version); where links are not supported the file is copied atomically.
    """
    path, folder = Path(path), history_dir(path)
    folder.mkdir(exist_ok=True)
    kept = folder / f"step-{step:07d}.pt"
    kept.unlink(missing_ok=True)
    try:
        os.link(path, kept)
    except OSError:
        with atomic_writer(kept) as out, open(path, "rb") as src:
            shutil.copyfileobj(src, out)
    saved = sorted((p for p in folder.iterdir() if HISTORY_PATTERN.match(p.name)),
                   key=lambda p: int(HISTORY_PATTERN.match(p.name).group(1)), reverse=True)
    for old in saved[keep_n:]:
        old.unlink(missing_ok=True)
    return kept


def read_checkpoint_file(path: str | Path, flag: str, mmap: bool = False) -> dict[str, Any]:
    """The payload of a dalle_dist single-file checkpoint, or a one-line CheckpointError.

    mmap: map the tensors instead of reading them (to look at the metadata cheaply).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{flag} {path} does not exist", "check the path")
    if path.is_dir():
        raise CheckpointError(f"{flag} {path} is a directory, not a checkpoint file",
                              "give the .pt file written by dalle-dist")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        # torch says "Weights only load failed" for any file it cannot unpickle safely;
        # only "Unsupported global" means the file really names Python code to run.
        if "Unsupported global" in str(exc) or "Unsupported class" in str(exc):
            raise CheckpointError(
                f"{flag} {path} carries pickled Python objects, refused unread "
                "(loading it could run arbitrary code)",
                "use a checkpoint written by dalle-dist, or export safetensors",
            ) from None
        raise CheckpointError(f"{flag} {path} is not a readable checkpoint (not a torch file)",
                              "the file is truncated or corrupt; use an earlier one") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{flag} {path} is not a readable checkpoint ({reason})",
                              "the file is truncated or corrupt; use an earlier one") from None
    if not isinstance(payload, dict) or "format_version" not in payload or "kind" not in payload:
        raise CheckpointError(f"{flag} {path} is not a dalle_dist checkpoint",
                              "train one with dalle-dist train-vae or dalle-dist train")
    if payload["format_version"] > FORMAT_VERSION:
        raise CheckpointError(
            f"{flag} {path} has checkpoint format {payload['format_version']}, newer than "
            f"this dalle_dist reads ({FORMAT_VERSION})", "upgrade dalle_dist")
    return payload
