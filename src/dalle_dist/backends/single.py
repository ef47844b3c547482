"""`single`: one process, one device. The default, and the reference the others must match."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dalle_dist.backends.base import DistributedBackend, Engine
from dalle_dist.errors import ConfigError


def default_device() -> torch.device:
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


class SingleBackend(DistributedBackend):
    name = "single"

    def __init__(self, device: torch.device | None = None) -> None:
        self._device = device or default_device()

    def is_available(self) -> tuple[bool, str]:
        return True, ""

    def initialize(self) -> None:
        pass

    @property
    def device(self) -> torch.device:
        return self._device

    def check_batch_size(self, batch_size: int) -> None:
        if batch_size <= 0:
            raise ConfigError(f"--batch_size must be positive, got {batch_size}")

    def distribute(self, module: nn.Module, optimizer: torch.optim.Optimizer,
                   scheduler: Any | None = None) -> Engine:
        return Engine(module.to(self.device), optimizer, scheduler)
