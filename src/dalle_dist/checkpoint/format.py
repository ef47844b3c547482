"""The checkpoint format: what a payload holds, and reading and writing one file safely.

Layout (docs/design.md, "Checkpoints"): format version, kind ("vae" or "dalle"), configs as
plain dicts, weights, optimizer and scheduler state, the loop position (`LoopState`),
every rank's RNG states, backend, world size and package version. A DALL-E checkpoint
also carries its VAE (config and weights), so it alone is enough to sample.

Writing: one torch.save of plain types and tensors, atomically (temporary file, fsync,
rename). Reading: torch.load(weights_only=True) only, so a file carrying pickled objects
is refused before any of its code can run; and memory-mapped copy-on-write, so the ranks of
a node share one copy of the file in the page cache (docs/checkpoints.md, "Host memory at
resume").
"""

from __future__ import annotations

import contextlib
import mmap as mmap_flags
import pickle
import zipfile
from collections.abc import Iterator
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
    #: samples of the current epoch trained on, over all ranks: where a resume with
    #: another rank count or --ga_steps seeks to (None: written before it was recorded)
    samples: int | None = 0

    @classmethod
    def from_checkpoint(cls, payload: dict) -> LoopState:
        return cls(epoch=payload["epoch"], step=payload["step"],
                   batch=payload.get("batch", 0), loss_sum=payload.get("loss_sum", 0.0),
                   samples=payload.get("samples"))


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
    allow-list (torch.serialization.safe_globals) is in force if it set one.

    mmap: the tensors are views of the file mapped copy-on-write (MAP_PRIVATE), whatever
    default mmap flags the process set: pages are read when first touched and shared with
    every process that maps the file, and an in-place op on a loaded tensor (an optimizer
    stepping the CPU state it was given) copies the page instead of writing into the file.
    """
    mmap = mmap and _is_zip(path)  # torch maps its zip format only: others are read whole
    try:
        with mapped_privately() if mmap else contextlib.nullcontext():
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except (pickle.UnpicklingError, KeyError) as exc:  # KeyError: bytes that are no pickle
        if "Unsupported global" in str(exc) or "Unsupported class" in str(exc):
            raise CheckpointError(f"{flag} {path} carries {pickled}, refused unread (loading "
                                  "it could run arbitrary code)", pickled_fix) from None
        raise CheckpointError(f"{flag} {path} is not a readable checkpoint (not a torch file)",
                              f"the file is truncated or corrupt; {corrupt_fix}") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{flag} {path} is not a readable checkpoint ({reason})",
                              f"the file is truncated or corrupt; {corrupt_fix}") from None


def _is_zip(path: Path) -> bool:
    """Whether the file starts as torch's zip format does (torch.serialization checks the
    same four bytes)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError:
        return False


@contextlib.contextmanager
def mapped_privately() -> Iterator[None]:
    """torch.load(mmap=True) maps with the process-wide default flags, MAP_PRIVATE unless
    someone called torch.serialization.set_default_mmap_options(MAP_SHARED): then writes
    to a loaded tensor would reach the checkpoint file. Windows has no such flags (torch
    maps copy-on-write there)."""
    private = getattr(mmap_flags, "MAP_PRIVATE", None)
    if private is None:
        yield
        return
    previous = torch.serialization.get_default_mmap_options()
    # called, not entered: a plain function in older torch, a context manager in newer
    torch.serialization.set_default_mmap_options(private)
    try:
        yield
    finally:
        torch.serialization.set_default_mmap_options(previous)


def read_checkpoint_file(path: str | Path, flag: str, mmap: bool = True) -> dict[str, Any]:
    """The payload of a dalle_dist single-file checkpoint, or a one-line CheckpointError.

    mmap (the default, for every reader: resume, --dalle_path, --vae_path, generate, the
    checkpoint tools): the tensors map the file copy-on-write instead of being read into
    this process's memory (load_weights_only), so looking at the metadata reads no
    weights, and the ranks of a node that all load one file share it in the page cache.
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
