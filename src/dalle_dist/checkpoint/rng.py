"""Every rank's RNG states in a checkpoint, so a resumed run repeats an uninterrupted one.

Each rank keeps the CUDA generator of its own device only: the other GPUs of its machine
belong to other ranks, which save their own. (Checkpoints written before this rule hold a
list with every visible GPU's state under "cuda"; a rank restores its own entry of it.)
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def _cuda_device(device: torch.device | None) -> torch.device | None:
    """The CUDA device whose generator a rank keeps: `device` when it is a GPU, or, when
    none is named, the current one (backend.initialize() made it the rank's own); None
    when the rank works on the CPU."""
    if device is not None and device.type != "cuda":
        return None
    if device is not None and device.index is not None:
        return device
    if device is None and not torch.cuda.is_available():
        return None
    return torch.device("cuda", torch.cuda.current_device())


def capture_rng(device: torch.device | None = None) -> dict[str, Any]:
    """Python, numpy and torch RNG states as plain types and tensors, with the CUDA
    generator of this rank's `device` alone under "cuda" (no "cuda" on the CPU)."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }
    cuda = _cuda_device(device)
    if cuda is not None:
        state["cuda"] = torch.cuda.get_rng_state(cuda)
    return state


def own_cuda_state(saved: torch.Tensor | list[torch.Tensor] | None, device: torch.device
                   ) -> torch.Tensor | None:
    """The CUDA generator state a checkpoint holds for `device`: the one tensor a rank now
    saves, or, from a checkpoint of the earlier form (a list of every visible GPU's state),
    the entry of the rank's own GPU; None when there is none (saved on the CPU, or on a
    machine with fewer GPUs)."""
    if saved is None or isinstance(saved, torch.Tensor):
        return saved
    index = device.index or 0
    return saved[index] if index < len(saved) else None


def restore_rng(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Put back what capture_rng took; the CUDA state goes to this rank's `device` only
    (default: the current CUDA device)."""
    random.setstate(tuple(state["python"]))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    cuda = _cuda_device(device)
    if cuda is not None:
        own = own_cuda_state(state.get("cuda"), cuda)
        if own is not None:
            torch.cuda.set_rng_state(own, cuda)


def restore_rank_rng(saved: dict[str, Any] | list[dict[str, Any]], rank: int,
                     world_size: int, seed: int, device: torch.device | None = None) -> bool:
    """Put back this rank's RNG states (its CUDA one onto `device`); True when the run
    continues exactly.

    A checkpoint of another world size has no states for some ranks: those are reseeded
    from (seed, rank, step) instead, and the run goes on, no longer bit-identical.
    """
    states = saved if isinstance(saved, list) else [saved]
    if len(states) == world_size:
        restore_rng(states[rank], device)
        return True
    random.seed(seed + rank)
    np.random.seed(seed + rank)
    torch.manual_seed(seed + rank)
    return False
