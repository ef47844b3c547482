"""The checkpoint format: what a payload holds, and reading and writing one file safely.

Layout (docs/design.md, "Checkpoints"): format version, kind ("vae" or "dalle"), configs as
plain dicts, weights, optimizer and scheduler state, the loop position (`LoopState`),
every rank's RNG states, backend, world size and package version. A DALL-E checkpoint
also carries its VAE (config and weights), so it alone is enough to sample.

Writing: one torch.save of plain types and tensors, atomically (temporary file, fsync,
rename). Reading: torch.load(weights_only=True) only, so a file carrying pickled objects
is refused before any of its code can run.
"""

from __future__ import annotations

import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dalle_dist import __version__
from dalle_dist.errors import CheckpointError
from dalle_dist.fileio import atomic_writer

FORMAT_VERSION = 1

KIND_NAMES = {"vae": "a VAE", "dalle": "a DALL-E"}


@dataclass
class LoopState:
    """Where training is: with the RNG states, all a resumed run needs to continue exactly.

    Its fields are saved as they are (`dataclasses.asdict`) beside the weights."""

    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps taken (each of --ga_steps micro-batches)
    batch: int = 0  # micro-batches done in the current epoch (saves fall on step boundaries)
    loss_sum: float = 0.0  # their summed loss, for the plateau scheduler at epoch end

    @classmethod
    def from_checkpoint(cls, payload: dict) -> LoopState:
        return cls(epoch=payload["epoch"], step=payload["step"],
                   batch=payload.get("batch", 0), loss_sum=payload.get("loss_sum", 0.0))


def checkpoint_meta(kind: str, configs: dict[str, Any], position: dict[str, Any],
                    rng: list[dict[str, Any]], backend: str, world_size: int,
                    **extra: Any) -> dict[str, Any]:
    """Everything but the engine's state (weights, optimizer, scheduler).

    position: epoch, step and where inside the epoch (LoopState as a dict);
    rng: every rank's RNG states, in rank order.
    """
    return {
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "package_version": __version__,
        "configs": configs,
        **position,
        "rng": rng,
        "backend": backend,
        "world_size": world_size,
        **extra,
    }


def check_kind(payload: dict[str, Any], path: str | Path, flag: str, kind: str) -> None:
    """Insist a payload is of `kind`, naming the right flag when it is not."""
    found = payload["kind"]
    if found != kind:
        fix = (f"train a DALL-E on this VAE with: dalle-dist train --vae_path {path}"
               if kind == "dalle" else
               "give a VAE from dalle-dist train-vae; a DALL-E checkpoint resumes with "
               "--dalle_path")
        raise CheckpointError(f"{flag} {path} is {KIND_NAMES.get(found, repr(found))} "
                              f"checkpoint, but {flag} needs {KIND_NAMES[kind]} one", fix)


def write_checkpoint_file(path: str | Path, payload: dict[str, Any]) -> None:
    with atomic_writer(path) as f:
        torch.save(payload, f)



def load_weights_only(path: Path, flag: str, pickled_fix: str, corrupt_fix: str, *,
                      mmap: bool = False, pickled: str = "pickled Python objects") -> Any:
    """torch.load with weights_only=True, its failures as one-line CheckpointErrors.

    torch says "Weights only load failed" for any file it cannot unpickle safely; only an
    "Unsupported global" (or class) means the file really names Python code to run, which
    is refused unread (`pickled` says what it carries, `pickled_fix` what to give
    instead); anything else is a truncated or corrupt file (`corrupt_fix`). The caller's
    allow-list (torch.serialization.safe_globals) is in force if it set one."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        if "Unsupported global" in str(exc) or "Unsupported class" in str(exc):
            raise CheckpointError(f"{flag} {path} carries {pickled}, refused unread (loading "
                                  "it could run arbitrary code)", pickled_fix) from None
        raise CheckpointError(f"{flag} {path} is not a readable checkpoint (not a torch file)",
                              f"the file is truncated or corrupt; {corrupt_fix}") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{flag} {path} is not a readable checkpoint ({reason})",
                              f"the file is truncated or corrupt; {corrupt_fix}") from None

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
    payload = load_weights_only(path, flag, "use a checkpoint written by dalle-dist, or export "
                                "safetensors", "use an earlier one", mmap=mmap)
    if not isinstance(payload, dict) or "format_version" not in payload or "kind" not in payload:
        raise CheckpointError(f"{flag} {path} is not a dalle_dist checkpoint",
                              "train one with dalle-dist train-vae or dalle-dist train")
    if payload["format_version"] > FORMAT_VERSION:
        raise CheckpointError(
            f"{flag} {path} has checkpoint format {payload['format_version']}, newer than "
            f"this dalle_dist reads ({FORMAT_VERSION})", "upgrade dalle_dist")
    return payload
