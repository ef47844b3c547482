"""Batches for one rank: a DistributedSampler (world 1 in a single process) under a DataLoader.

Every backend, single included, draws through the same sampler, so 2 ranks x batch b see
exactly the samples 1 process x batch 2b sees, step for step. An epoch can start part-way
(a resumed run): the sampler drops the samples already trained on without loading them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from dalle_dist.errors import DataError


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can begin an epoch after its first `start` samples."""

    start = 0

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(super().__iter__(), self.start, None)

    def __len__(self) -> int:
        return self.num_samples - self.start


class EpochLoader:
    """A DataLoader whose sampler is reshuffled per epoch (`epoch(e)` yields its batches)."""

    def __init__(self, dataset: Dataset, batch_size: int, rank: int, world_size: int,
                 seed: int, num_workers: int, collate: Callable[[Any], Any]) -> None:
        if len(dataset) < batch_size * world_size:
            raise DataError(
                f"the dataset has {len(dataset)} items, too few for a batch of {batch_size} "
                f"on each of {world_size} ranks", "lower --batch_size or add data")
        self.dataset, self.batch_size = dataset, batch_size
        self.sampler = ResumableSampler(dataset, num_replicas=world_size, rank=rank,
                                          shuffle=True, seed=seed, drop_last=True)
        self.loader = DataLoader(dataset, batch_size=batch_size, sampler=self.sampler,
                                 drop_last=True, num_workers=num_workers, collate_fn=collate,
                                 persistent_workers=num_workers > 0,
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
