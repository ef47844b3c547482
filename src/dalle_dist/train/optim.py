"""The optimizer both models train with."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def make_adam(params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Adam:
    """Adam, fused into one kernel per step where torch supports it (CPU and CUDA floats).

    The unfused loop costs about 15 ms a step for 5M parameters on 2 CPU cores, as much
    as a tenth of a small model's step; the fused kernel a fifth of that.
    """
    params = list(params)
    fusable = all(p.dtype.is_floating_point and p.device.type in ("cpu", "cuda")
                  for p in params)
    return torch.optim.Adam(params, lr=lr, fused=fusable or None)
