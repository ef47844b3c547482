"""Batches for one rank: a DistributedSampler (world 1 in a single process) under a DataLoader.

Every backend, single included, draws through the same sampler, so 2 ranks x batch b see
exactly the samples 1 process x batch 2b sees, step for step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, Dataset, DistributedSampler

from dalle_dist.errors import DataError


class EpochLoader:
    """A DataLoader whose sampler is reshuffled per epoch (`epoch(e)` yields its batches)."""

    def __init__(self, dataset: Dataset, batch_size: int, rank: int, world_size: int,
                 seed: int, num_workers: int, collate: Callable[[Any], Any]) -> None:
        if len(dataset) < batch_size * world_size:
            raise DataError(
                f"the dataset has {len(dataset)} items, too few for a batch of {batch_size} "
                f"on each of {world_size} ranks", "lower --batch_size or add data")
        self.dataset, self.batch_size = dataset, batch_size
        self.sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank,
                                          shuffle=True, seed=seed, drop_last=True)
        self.loader = DataLoader(dataset, batch_size=batch_size, sampler=self.sampler,
                                 drop_last=True, num_workers=num_workers, collate_fn=collate,
                                 persistent_workers=num_workers > 0)

    def __len__(self) -> int:
        return len(self.loader)

    def epoch(self, epoch: int) -> Iterator[Any]:
        self.sampler.set_epoch(epoch)
        return iter(self.loader)
