"""The contract every distributed backend meets, and the engine it hands the loop.

The training loop holds a DistributedBackend object and the Engine it returns; it never
asks which backend is running (DESIGN.md, "Layers"). Nothing here knows about DALL-E.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from dalle_dist.checkpoint_io import write_checkpoint_file


class Engine:
    """A model with its optimizer and scheduler, driven through one interface.

    This base runs in one process; backends subclass it to wrap DDP, FSDP, DeepSpeed or
    Horovod behind the same methods.
    """

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Any | None = None) -> None:
        self.module = module  # the bare model: its state_dict has no wrapper prefixes
        self.optimizer = optimizer
        self.scheduler = scheduler

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip_grad_norm(self, max_norm: float | None) -> float | None:
        """Clip to max_norm and return the norm before clipping (None: no clipping)."""
        if not max_norm:
            return None
        return float(torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm))

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def state_dict(self) -> dict[str, Any]:
        return {
            "weights": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["weights"])
        if state.get("optimizer"):
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler"):
            self.scheduler.load_state_dict(state["scheduler"])

    def save(self, path: str | Path, meta: dict[str, Any]) -> None:
        """Write meta + weights + optimizer + scheduler as one single-file checkpoint."""
        write_checkpoint_file(path, {**meta, **self.state_dict()})


class DistributedBackend(ABC):
    """How processes are started, talk to each other, and wrap the model."""

    name: ClassVar[str]

    @abstractmethod
    def is_available(self) -> tuple[bool, str]:
        """(usable here, why not), without raising and without side effects."""

    @abstractmethod
    def initialize(self) -> None: ...

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def is_local_root(self) -> bool:
        return self.local_rank == 0

    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    def barrier(self) -> None:
        """Wait for every rank (nothing to wait for in one process)."""

    def average(self, tensor: torch.Tensor) -> torch.Tensor:
        """Mean of `tensor` over ranks."""
        return tensor

    @abstractmethod
    def check_batch_size(self, batch_size: int) -> None: ...

    @abstractmethod
    def distribute(self, module: nn.Module, optimizer: torch.optim.Optimizer,
                   scheduler: Any | None = None) -> Engine: ...
