"""What the training loop trains: the VAE or DALL-E, behind one small interface.

The loop (train/loop.py) only calls these methods, so it reads the same for both models
and for every backend. Optimizer and scheduler come as factories because FSDP and
DeepSpeed must build them after wrapping or sharding the parameters.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from PIL import Image
from torch import nn

from dalle_dist.backends import Engine
from dalle_dist.backends.ema import EMASettings
from dalle_dist.model.init import WeightStream, materialise
from dalle_dist.train.compile import CompiledBlocks
from dalle_dist.train.optim import make_adam

Batch = tuple[torch.Tensor, torch.Tensor | None, list[str]]


class Task(ABC):
    kind: str  # "vae" or "dalle": the checkpoint kind
    #: built on the meta device when initial_weights() gives its values, else on the CPU;
    #: the backend places (FSDP: shards) and wraps it
    model: nn.Module
    learning_rate: float
    #: train --compile: the model's compiled blocks, which the loop times (None: eager)
    compiled: CompiledBlocks | None = None
    #: --ema_decay: the EMA the engine keeps of the model's weights (None: none)
    ema: EMASettings | None = None

    @abstractmethod
    def build_model(self) -> nn.Module:
        """A fresh model of this task's architecture (for sampling from gathered weights)."""

    def initial_weights(self) -> WeightStream | None:
        """The values of a meta-built `model` before training, one full parameter at a time
        (model/init.py); None: `model` was built with its values."""
        return None

    def materialise(self) -> nn.Module:
        """`model` with its initial weights on the CPU, whole: for code that needs the
        whole model in one process (references in tests and benches). Training leaves
        this to the backend, which places the values itself (FSDP: each rank its shards)."""
        weights = self.initial_weights()
        if weights is not None:
            materialise(self.model, weights)
        return self.model

    def make_optimizer(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return make_adam(params, self.learning_rate)

    def make_scheduler(self, optimizer: torch.optim.Optimizer) -> Any | None:
        return None

    def shard_units(self, model: nn.Module) -> Sequence[nn.Module | list[nn.Module]]:
        """Submodules FSDP shards one by one (the root is always sharded too); a list is
        one unit of several modules (fully_shard([...]): modules sharing parameters)."""
        return ()

    @abstractmethod
    def inputs(self, batch: Batch, device: torch.device, training: bool = True
               ) -> tuple[Any, ...]:
        """The arguments of the model's forward for one batch; it returns {"loss": ..., ...}.
        training=False: for the validation loss (no training-only augmentation, e.g. the
        null captions of --null_cond_prob)."""

    def after_step(self, step: int, engine: Engine) -> None:
        """Per-step schedules (VAE temperature and learning-rate decay)."""

    def after_epoch(self, epoch: int, mean_loss: float, engine: Engine) -> None:
        """Per-epoch schedules (DALL-E's plateau decay)."""

    def step_metrics(self, step: int) -> dict[str, float]:
        """Extra values for the metrics line, e.g. the VAE temperature."""
        return {}

    @abstractmethod
    def sample_grid(self, model: nn.Module, batch: Batch, device: torch.device) -> Image.Image:
        """A picture of how training is going, drawn with `model` (full weights)."""

    @abstractmethod
    def configs(self) -> dict[str, Any]:
        """Plain-dict configs stored in every checkpoint."""

    def extra_state(self) -> dict[str, Any]:
        """Checkpoint entries beyond the engine's (a DALL-E checkpoint carries its VAE)."""
        return {}
