"""What a dalle_dist checkpoint holds beyond weights, and reading one of a given kind.

Layout (DESIGN.md, "Checkpoints"): format version, kind ("vae" or "dalle"), configs as
plain dicts, weights, optimizer and scheduler state, epoch, step, the position inside the
epoch, every rank's RNG states, backend, world size and package version. A DALL-E
checkpoint also carries its VAE (config and weights), so it alone is enough to sample.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dalle_dist import __version__
from dalle_dist.checkpoint_io import FORMAT_VERSION, read_checkpoint_file
from dalle_dist.data.tokenizer import Tokenizer, tokenizer_from_dict
from dalle_dist.ds_checkpoint import consolidated_weights, is_ds_checkpoint_dir, read_ds_meta
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
    random.setstate(tuple(state["python"]))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def restore_rank_rng(saved: dict[str, Any] | list[dict[str, Any]], rank: int,
                     world_size: int, seed: int) -> bool:
    """Put back this rank's RNG states; True when the run continues exactly.

    A checkpoint of another world size has no states for some ranks: those are reseeded
    from (seed, rank, step) instead, and the run goes on, no longer bit-identical.
    """
    states = saved if isinstance(saved, list) else [saved]
    if len(states) == world_size:
        restore_rng(states[rank])
        return True
    random.seed(seed + rank)
    np.random.seed(seed + rank)
    torch.manual_seed(seed + rank)
    return False


def checkpoint_meta(kind: str, configs: dict[str, Any], position: dict[str, Any],
                    rng: list[dict[str, Any]], backend: str, world_size: int,
                    **extra: Any) -> dict[str, Any]:
    """Everything but the engine's state (weights, optimizer, scheduler).

    position: epoch, step and where inside the epoch (see train.loop.LoopState);
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


def read_any_checkpoint(path: str | Path, flag: str, keep_ds_dir: bool = False
                        ) -> dict[str, Any]:
    """A single file's payload, or a DeepSpeed directory's metadata with its weights
    consolidated to fp32 (no optimizer state: that stays in DeepSpeed's partitions).

    keep_ds_dir: leave a DeepSpeed directory unconsolidated (`ds_dir`, `ds_tag`, no
    weights), for the deepspeed backend to load itself.
    """
    if not is_ds_checkpoint_dir(path):
        return read_checkpoint_file(path, flag)
    meta = read_ds_meta(path, flag)
    if keep_ds_dir:
        return {**meta, "weights": None, "optimizer": None}
    weights = consolidated_weights(meta["ds_dir"], meta["ds_tag"], flag)
    rest = {k: v for k, v in meta.items() if k not in ("ds_dir", "ds_tag")}
    return {**rest, "weights": weights, "optimizer": None}


def load_checkpoint(path: str | Path, flag: str, kind: str, keep_ds_dir: bool = False
                    ) -> dict[str, Any]:
    """Read a checkpoint and insist it is of `kind`, naming the right flag when it is not."""
    payload = read_any_checkpoint(path, flag, keep_ds_dir)
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
