"""This rank's share of the held-out samples, in batches every rank takes as many of.

A validation pass may be collective (FSDP and ZeRO-3 gather weights in every forward, DDP
broadcasts buffers), so every rank runs the same number of forwards: a rank with fewer
held-out samples pads with a batch it weighs 0. Each batch comes as (batch, n): n of its
rows are real samples, the loss of the pass is sum(mean loss x n) / sum(n) over all ranks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Subset

#: (the collated batch, how many of its samples count)
WeightedBatch = tuple[Any, int]


def padded(batches: Iterator[Any], steps: int, pad: Callable[[], Any]) -> Iterator[WeightedBatch]:
    """Exactly `steps` weighted batches: those of `batches` (n = their size), then `pad()`
    batches weighing 0 until every rank has taken `steps`."""
    taken, first = 0, None
    for batch in batches:
        if taken == steps:
            break
        first = batch if first is None else first
        taken += 1
        yield batch, len(batch[0])
    for _ in range(steps - taken):
        yield (first if first is not None else pad()), 0


class HeldOutLoader:
    """The held-out part of a map-style dataset, dealt out to ranks by position.

    Read in order, without shuffling or dropping a last partial batch: each held-out
    sample counts exactly once over all ranks."""

    def __init__(self, dataset: Dataset, batch_size: int, rank: int, world_size: int,
                 num_workers: int, collate: Callable[[Any], Any],
                 pin_memory: bool = False) -> None:
        self.dataset, self.batch_size, self.collate = dataset, batch_size, collate
        self.samples = len(dataset)
        self.steps = max(math.ceil(len(range(r, self.samples, world_size)) / batch_size)
                         for r in range(world_size))
        self.loader = DataLoader(Subset(dataset, range(rank, self.samples, world_size)),
                                 batch_size=batch_size, shuffle=False, drop_last=False,
                                 num_workers=num_workers, collate_fn=collate,
                                 pin_memory=pin_memory,
                                 # starting an iterator must not draw from the global RNG
                                 generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return self.steps

    def batches(self) -> Iterator[WeightedBatch]:
        """This rank's held-out batches with their weights; len(self) of them."""
        return padded(iter(self.loader), self.steps,
                      lambda: self.collate([self.dataset[0]]))

    def first_batch(self) -> Any:
        """The batch the sample grids draw their captions from (the same every time)."""
        return self.collate([self.dataset[i] for i in range(min(self.batch_size,
                                                                  self.samples))])

    def head(self, count: int) -> Any:
        """The first `count` held-out samples (fewer if it holds fewer) as one batch, the
        same on any rank and world size (train --eval_every_n_steps draws them)."""
        return self.collate([self.dataset[i] for i in range(min(count, self.samples))])
