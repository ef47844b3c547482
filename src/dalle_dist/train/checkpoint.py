"""What a dalle_dist checkpoint holds beyond weights, and reading one of a given kind.

Layout (DESIGN.md, "Checkpoints"): format version, kind ("vae" or "dalle"), configs as
plain dicts, weights, optimizer and scheduler state, epoch, step, RNG states, backend,
world size and package version. A DALL-E checkpoint also carries its VAE (config and
weights), so it alone is enough to sample.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from dalle_dist import __version__
from dalle_dist.checkpoint_io import FORMAT_VERSION, read_checkpoint_file
from dalle_dist.errors import CheckpointError

KIND_NAMES = {"vae": "a VAE", "dalle": "a DALL-E"}
KIND_COMMANDS = {"vae": "dalle-dist train-vae", "dalle": "dalle-dist train"}


def capture_rng() -> dict[str, Any]:
    """Python, numpy and torch RNG states as plain types and tensors."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_meta(kind: str, configs: dict[str, Any], epoch: int, step: int,
                    backend: str, world_size: int, **extra: Any) -> dict[str, Any]:
    """Everything but the engine's state (weights, optimizer, scheduler)."""
    return {
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "package_version": __version__,
        "configs": configs,
        "epoch": epoch,
        "step": step,
        "rng": capture_rng(),
        "backend": backend,
        "world_size": world_size,
        **extra,
    }


def load_checkpoint(path: str, flag: str, kind: str) -> dict[str, Any]:
    """Read a checkpoint and insist it is of `kind`, naming the right flag when it is not."""
    payload = read_checkpoint_file(path, flag)
    found = payload["kind"]
    if found != kind:
        other_flag = {"vae": "--vae_path", "dalle": "--dalle_path"}.get(found, "")
        raise CheckpointError(
            f"{flag} {path} is {KIND_NAMES.get(found, repr(found))} checkpoint, "
            f"but {flag} needs {KIND_NAMES[kind]} one",
            f"train one with {KIND_COMMANDS[kind]}"
            + (f", or pass this file as {other_flag}" if other_flag and other_flag != flag else ""),
        )
    return payload
