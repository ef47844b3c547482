"""The loader's worker count, pinning and prefetch: how batches arrive, never which.

Bugs these catch: a default that divides the CPUs by the whole world instead of the ranks
on this node (8 GPUs x 12 CPUs would get 0 workers), that keeps no CPU for the training
process, that starts workers on CPU where they take cores from the step, or that has no
cap; workers, persistent workers or prefetch changing which samples a step sees.
"""

from __future__ import annotations

import pytest
import torch

from dalle_dist.data import CaptionCollate, EpochLoader, ShapesDataset
from dalle_dist.data.loader import MAX_DEFAULT_WORKERS, check_num_workers, default_num_workers
from dalle_dist.data.tokenizer import ByteTokenizer
from dalle_dist.errors import ConfigError

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


@pytest.mark.parametrize(("cpus", "local_ranks", "expected"), [
    (16, 1, MAX_DEFAULT_WORKERS),  # capped
    (96, 8, MAX_DEFAULT_WORKERS),  # 12 per rank, one kept: 11, capped at 8
    (32, 8, 3),  # 4 CPUs per rank, one kept for the rank's own process
    (2, 1, 1),
    (1, 1, 0),  # nothing to spare
    (4, 8, 0),  # fewer CPUs than ranks: never negative
])
def test_default_on_cuda_is_cpus_per_local_rank_less_one_capped(cpus: int, local_ranks: int,
                                                                 expected: int) -> None:
    assert default_num_workers(CUDA, local_ranks, cpus) == expected


def test_default_on_cpu_is_the_main_process() -> None:
    """On CPU the step's own threads use every core: workers would take them."""
    assert default_num_workers(CPU, 1, 64) == 0
    assert default_num_workers(CPU, 2) == 0


def test_a_negative_count_is_a_user_error() -> None:
    assert check_num_workers(3) == 3
    with pytest.raises(ConfigError, match="--num_workers must be >= 0, got -1"):
        check_num_workers(-1)


def _epochs(workers: int) -> list[list[torch.Tensor]]:
    dataset = ShapesDataset(48, 16, seed=3)
    collate = CaptionCollate(ByteTokenizer(), 64, False)
    loader = EpochLoader(dataset, 8, rank=1, world_size=2, seed=5, num_workers=workers,
                         collate=collate)
    # epoch 0 whole, epoch 1 resumed after its first batch, epoch 2 whole, each drawn
    # before the next starts (as the loop does): the persistent workers serve all three
    return [[torch.cat([images.flatten(), text.flatten().float()])
             for images, text, _ in loader.epoch(epoch, start)]
            for epoch, start in ((0, 0), (1, 1), (2, 0))]


def test_workers_yield_the_batches_the_main_process_yields() -> None:
    """Persistent workers with prefetch: same batches, same order, every epoch, also one
    started part-way (a resumed run), as loading in the main process. Seen failing with
    `epoch()` setting the sampler's epoch after iter(): workers prefetch their first
    indices when the iterator is made, the main process only at the first batch."""
    main, workers = _epochs(0), _epochs(2)
    assert [len(run) for run in main] == [3, 2, 3]
    for expected, got in zip(main, workers, strict=True):
        assert len(expected) == len(got)
        for a, b in zip(expected, got, strict=True):
            assert torch.equal(a, b)
    assert not torch.equal(main[0][0], main[2][0]), "epochs are reshuffled"
