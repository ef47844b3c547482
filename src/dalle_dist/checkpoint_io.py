"""Reading and writing single-file checkpoints safely.

Writing: one torch.save of plain types and tensors, atomically (temporary file, fsync,
rename). Reading: torch.load(weights_only=True) only, so a file carrying pickled objects
is refused before any of its code can run.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from dalle_dist.errors import CheckpointError
from dalle_dist.fileio import atomic_writer

FORMAT_VERSION = 1


def write_checkpoint_file(path: str | Path, payload: dict[str, Any]) -> None:
    with atomic_writer(path) as f:
        torch.save(payload, f)


def read_checkpoint_file(path: str | Path, flag: str) -> dict[str, Any]:
    """The payload of a dalle_dist single-file checkpoint, or a one-line CheckpointError."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{flag} {path} does not exist", "check the path")
    if path.is_dir():
        raise CheckpointError(f"{flag} {path} is a directory, not a checkpoint file",
                              "give the .pt file written by dalle-dist")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
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
