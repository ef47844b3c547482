"""The optimizer both models train with."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def make_adam(params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Adam:
    """Adam, fused into one kernel per step where torch supports it (CPU and CUDA floats).

    The unfused loop is a noticeable part of a small model's step; the fused kernel costs
    a fraction of it (figures: docs/benchmarks.md, "Training").
    """
    params = list(params)
    fusable = all(p.dtype.is_floating_point and p.device.type in ("cpu", "cuda")
                  for p in params)
    return torch.optim.Adam(params, lr=lr, fused=fusable or None)
