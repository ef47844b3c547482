"""Batches for one rank: a DistributedSampler (world 1 in a single process) under a DataLoader.

Every backend, single included, draws through the same sampler, so 2 ranks x batch b see
exactly the samples 1 process x batch 2b sees, step for step. An epoch can start part-way
(a resumed run): the sampler drops the samples already trained on without loading them.

On CUDA the batches come from worker processes into pinned memory, so the step's
`.to(device, non_blocking=True)` copies overlap with compute (default_num_workers says how
many workers, and why none on CPU).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from dalle_dist.errors import ConfigError, DataError

#: The most loader processes --num_workers' default starts per rank: decoding and cropping
#: a batch of small images takes a few workers; each one more holds a copy of the dataset's
#: file list and its own prefetched batches in (pinned) memory.
MAX_DEFAULT_WORKERS = 8
#: Batches each worker keeps ready ahead of the step (torch's own default, named here): with
#: persistent workers that is workers x 2 batches queued while the accelerator computes.
PREFETCH_FACTOR = 2


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a scheduler's cgroup or taskset
    can give it fewer than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_num_workers(device: torch.device, local_ranks: int, cpus: int | None = None) -> int:
    """--num_workers when none is given: min(8, CPUs per local rank - 1) on CUDA, 0 on CPU.

    On CUDA the CPUs are free while the GPU computes, so images are decoded and cropped in
    workers and overlap with the step; each rank keeps one CPU for its own process (the
    step's kernel launches and the pinned copies). On CPU the step itself already uses every
    core (each local rank gets CPUs / local ranks threads): a worker would only take cores
    from the matmuls, so the data loads in the main process between steps.
    """
    if device.type != "cuda":
        return 0
    per_rank = (usable_cpus() if cpus is None else cpus) // max(local_ranks, 1)
    return max(0, min(MAX_DEFAULT_WORKERS, per_rank - 1))


def check_num_workers(num_workers: int) -> int:
    if num_workers < 0:
        raise ConfigError(f"--num_workers must be >= 0, got {num_workers}",
                          "0 loads in the main process; leave it out for the default")
    return num_workers


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can begin an epoch after its first `start` samples."""

    start = 0

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(super().__iter__(), self.start, None)

    def __len__(self) -> int:
        return self.num_samples - self.start


class EpochLoader:
    """A DataLoader whose sampler is reshuffled per epoch (`epoch(e)` yields its batches).

    held_out: the validation part's loader (data.heldout.HeldOutLoader) when make_loader
    split one off (--val_fraction), else None."""

    held_out: Any = None

    def __init__(self, dataset: Dataset, batch_size: int, rank: int, world_size: int,
                 seed: int, num_workers: int, collate: Callable[[Any], Any],
                 pin_memory: bool = False) -> None:
        if len(dataset) < batch_size * world_size:
            raise DataError(
                f"the dataset has {len(dataset)} items, too few for a batch of {batch_size} "
                f"on each of {world_size} ranks", "lower --batch_size or add data")
        self.dataset, self.batch_size = dataset, batch_size
        self.sampler = ResumableSampler(dataset, num_replicas=world_size, rank=rank,
                                          shuffle=True, seed=seed, drop_last=True)
        self.loader = DataLoader(dataset, batch_size=batch_size, sampler=self.sampler,
                                 drop_last=True, num_workers=num_workers, collate_fn=collate,
                                 # workers live across epochs: no re-spawn, and no re-read
                                 # of the dataset, at every epoch start
                                 persistent_workers=num_workers > 0,
                                 prefetch_factor=PREFETCH_FACTOR if num_workers else None,
                                 pin_memory=pin_memory,
                                 # its own generator: starting an epoch's iterator must not
                                 # draw from the global RNG a resumed run restores
                                 generator=torch.Generator().manual_seed(seed + rank))

    def __len__(self) -> int:
        """Batches in a whole epoch."""
        return self.sampler.num_samples // self.batch_size

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Any]:
        """The epoch's batches from batch `start` on."""
        self.sampler.set_epoch(epoch)
        self.sampler.start = start * self.batch_size
        return iter(self.loader)
