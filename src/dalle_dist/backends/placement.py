"""Which device each rank takes: its own GPU, never one it would share with another rank.

A pure function of counts every rank of a machine sees alike (DistributedBackend's
select_device reads them and calls it), so it is tested without a GPU
(tests/backends/test_devices.py).
"""

from __future__ import annotations

import re

import torch

from dalle_dist.errors import ConfigError


def rank_device(local_rank: int, local_ranks: int, gpus: int, launch: str,
                cuda_visible_devices: str | None = None) -> torch.device:
    """Local rank `local_rank`'s own GPU, `cuda:local_rank` (the CPU when `gpus` is 0).

    `local_ranks` ranks on a machine with `gpus` visible GPUs need one GPU each; with
    fewer GPUs this raises instead of doubling up (the old `local_rank % gpus` put two
    ranks on one GPU: two models and optimizers in its memory, and NCCL stopping at its
    first collective with "Duplicate GPU detected"). Every input is a count all ranks of a
    machine see alike, so all of them raise, before any of them waits for another.

    launch: the backend's launch line with N for the number of ranks (its launch_hint),
    shown with N = gpus as the fix. cuda_visible_devices: this rank's CUDA_VISIBLE_DEVICES;
    one GPU listed there may be a scheduler's per-rank binding (each rank sees its own GPU
    as cuda:0), which the user states with --device cuda:0.
    """
    if gpus <= 0:
        return torch.device("cpu")
    ranks = max(local_ranks, local_rank + 1)
    if ranks > gpus:
        line = re.sub(r"\bN\b", str(gpus), launch)
        fix = f"start at most {gpus} rank(s) per machine, one per GPU: {line}"
        if gpus == 1 and cuda_visible_devices:
            fix += ("; or, where each rank sees a GPU of its own through "
                    "CUDA_VISIBLE_DEVICES, pass --device cuda:0")
        raise ConfigError(f"{ranks} ranks on this machine but {gpus} visible GPU(s): "
                          "ranks would have to share a GPU", fix)
    return torch.device("cuda", local_rank)


def check_explicit_gpu(requested: torch.device, local_ranks: int, gpus: int) -> None:
    """Refuse `--device cuda:N` when several ranks of this machine see several GPUs: every
    rank would take GPU N (two models and optimizers in its memory, and NCCL stopping with
    "Duplicate GPU detected"). One visible GPU per rank is a scheduler's per-rank binding,
    where cuda:0 is each rank's own GPU, and stays allowed. Every input is a count all ranks
    of a machine see alike, so all of them refuse before any waits for another."""
    if requested.type != "cuda" or requested.index is None or local_ranks <= 1 or gpus <= 1:
        return
    raise ConfigError(f"--device {requested} with {local_ranks} ranks on this machine and "
                      f"{gpus} visible GPUs would put every rank on GPU {requested.index}",
                      "pass --device cuda (each rank takes its own GPU, cuda:LOCAL_RANK), or "
                      "leave --device out")


def rank_chunk(full: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """`rank`'s part of `full` under FSDP2's Shard(0): torch.chunk's split, with ranks past
    the last chunk holding an empty one (a dimension smaller than the world)."""
    chunks = torch.chunk(full, world_size, dim=0)
    if rank < len(chunks):
        return chunks[rank]
    return full.new_empty((0, *full.shape[1:]))
