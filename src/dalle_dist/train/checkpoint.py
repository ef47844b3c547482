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
from dalle_dist.data.tokenizer import Tokenizer, tokenizer_from_dict
from dalle_dist.errors import CheckpointError
from dalle_dist.model import DALLEConfig, DiscreteVAE, VAEConfig

KIND_NAMES = {"vae": "a VAE", "dalle": "a DALL-E"}


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
        fix = (f"train a DALL-E on this VAE with: dalle-dist train --vae_path {path}"
               if kind == "dalle" else
               "give a VAE from dalle-dist train-vae; a DALL-E checkpoint resumes with "
               "--dalle_path")
        raise CheckpointError(f"{flag} {path} is {KIND_NAMES.get(found, repr(found))} "
                              f"checkpoint, but {flag} needs {KIND_NAMES[kind]} one", fix)
    return payload


def vae_from_checkpoint(payload: dict[str, Any]) -> DiscreteVAE:
    """The VAE of a VAE checkpoint, or the one a DALL-E checkpoint carries, with weights."""
    configs = payload["configs"]
    if payload["kind"] == "vae":
        config, weights = configs["model"], payload["weights"]
    else:
        config, weights = configs["vae"], payload["vae_weights"]
    vae = DiscreteVAE(VAEConfig.from_dict(config))
    vae.load_state_dict(weights)
    return vae


def dalle_parts(payload: dict[str, Any]) -> tuple[DALLEConfig, DiscreteVAE, Tokenizer]:
    """What a DALL-E checkpoint alone rebuilds: model config, its VAE and its tokenizer."""
    configs = payload["configs"]
    return (DALLEConfig.from_dict(configs["model"]), vae_from_checkpoint(payload),
            tokenizer_from_dict(configs["tokenizer"]))
