"""What the training loop trains: the VAE or DALL-E, behind one small interface.

The loop (train/loop.py) only calls these methods, so it reads the same for both models
and for every backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from PIL import Image
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor | None, list[str]]


class Task(ABC):
    kind: str  # "vae" or "dalle": the checkpoint kind
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any | None

    @abstractmethod
    def inputs(self, batch: Batch, device: torch.device) -> tuple[Any, ...]:
        """The arguments of the model's forward for one batch; it returns {"loss": ..., ...}."""

    def after_step(self, step: int) -> None:
        """Per-step schedules (VAE temperature and learning-rate decay)."""

    def after_epoch(self, epoch: int, mean_loss: float) -> None:
        """Per-epoch schedules (DALL-E's plateau decay)."""

    def step_metrics(self, step: int) -> dict[str, float]:
        """Extra values for the metrics line, e.g. the VAE temperature."""
        return {}

    @abstractmethod
    def sample_grid(self, batch: Batch, device: torch.device) -> Image.Image:
        """A picture of how training is going, written every --sample_every_n_steps."""

    @abstractmethod
    def configs(self) -> dict[str, Any]:
        """Plain-dict configs stored in every checkpoint."""

    def extra_state(self) -> dict[str, Any]:
        """Checkpoint entries beyond the engine's (a DALL-E checkpoint carries its VAE)."""
        return {}
