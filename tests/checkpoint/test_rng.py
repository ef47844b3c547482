"""What a checkpoint keeps of a rank's random streams, and that older checkpoints restore.

A rank saves the CUDA generator of its own GPU only, and restores onto that GPU; a
checkpoint written before that rule holds every visible GPU's state in a list under
"cuda", of which a rank takes its own entry. There is no GPU here: the choice of entry
(own_cuda_state) is a pure function, tested directly; capture and restore run for real on
the CPU streams, where a checkpoint has no "cuda" key at all.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from dalle_dist.checkpoint.rng import capture_rng, own_cuda_state, restore_rank_rng, restore_rng


def draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_a_cpu_rank_keeps_no_cuda_state_and_restores_exactly() -> None:
    torch.manual_seed(3)
    for device in (None, torch.device("cpu")):
        state = capture_rng(device)
        assert set(state) == {"python", "numpy", "torch"}, "no GPU: nothing under 'cuda'"
        first = draws()
        restore_rng(state, device)
        assert draws() == first


def test_a_rank_takes_its_own_gpus_entry_of_an_older_checkpoint() -> None:
    """Bug caught: restoring entry 0 (or every entry, as set_rng_state_all did) on rank 1,
    whose generator is the second GPU's."""
    states = [torch.full((16,), i, dtype=torch.uint8) for i in range(4)]
    for index in range(4):
        assert torch.equal(own_cuda_state(states, torch.device("cuda", index)), states[index])
    # Saved on a machine with fewer GPUs than this rank's index: nothing of its own.
    assert own_cuda_state(states[:1], torch.device("cuda", 1)) is None
    # The form a rank saves now: its own state alone, whatever its GPU's index.
    assert own_cuda_state(states[2], torch.device("cuda", 5)) is states[2]
    assert own_cuda_state(None, torch.device("cuda", 0)) is None  # saved on a CPU


def test_an_older_checkpoints_streams_restore_on_the_cpu() -> None:
    """A two-rank checkpoint of the earlier form (each rank's dict with a list of every
    GPU's state) still resumes: the CPU streams exactly, the GPU states unused here."""
    torch.manual_seed(5)
    old = []
    for rank in range(2):
        state = capture_rng()
        state["cuda"] = [torch.zeros(16, dtype=torch.uint8), torch.ones(16, dtype=torch.uint8)]
        old.append(state)
        if rank == 0:
            first = draws()
    assert restore_rank_rng(old, 0, 2, seed=0)
    assert draws() == first
