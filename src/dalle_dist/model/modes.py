"""Running a module in eval mode for a while, mid-training."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[None]:
    """The module in eval mode while inside (no dropout), then back in the mode it was
    in, exception or not: sampling, sample grids and validation run in the middle of
    training, and a sampler called outside training must leave an eval model as it was."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)
