"""Every rank's RNG states in a checkpoint, so a resumed run repeats an uninterrupted one."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


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
