"""Training the discrete VAE (DALLE-pytorch's train_vae.py, as a Task)."""

from __future__ import annotations

from typing import Any

import torch
from PIL import Image
from torch import nn

from dalle_dist.backends import Engine
from dalle_dist.data.images import make_grid
from dalle_dist.model import DiscreteVAE, VAEConfig
from dalle_dist.model.modes import eval_mode
from dalle_dist.train.config import TrainConfig, VAESamples, VAESchedule
from dalle_dist.train.task import Batch, Task


class VAETask(Task):
    kind = "vae"

    def __init__(self, config: VAEConfig, schedule: VAESchedule, train: TrainConfig,
                 data: dict[str, Any], samples: VAESamples | None = None) -> None:
        """samples: --num_images_save, the images each sample grid shows."""
        self.config, self.schedule, self.train, self.data = config, schedule, train, data
        self.samples = samples or VAESamples()
        self.learning_rate = train.learning_rate
        self.model = self.build_model()
        self.temperature = schedule.starting_temp

    def build_model(self) -> nn.Module:
        return DiscreteVAE(self.config)

    def make_scheduler(self, optimizer: torch.optim.Optimizer) -> Any:
        return torch.optim.lr_scheduler.ExponentialLR(optimizer,
                                                      gamma=self.schedule.lr_decay_rate)

    def inputs(self, batch: Batch, device: torch.device, training: bool = True
               ) -> tuple[Any, ...]:
        return batch[0].to(device, non_blocking=True), self.temperature

    def after_step(self, step: int, engine: Engine) -> None:
        if step % self.schedule.anneal_every == 0:
            self.temperature = self.schedule.temperature(step)
            if engine.scheduler is not None:
                engine.scheduler.step()

    def step_metrics(self, step: int) -> dict[str, float]:
        return {"temperature": self.temperature}

    @torch.no_grad()
    def sample_grid(self, model: nn.Module, batch: Batch, device: torch.device) -> Image.Image:
        """Rows: originals, soft reconstructions, hard (argmax-code) reconstructions, of the
        batch's first --num_images_save images (all of a smaller batch)."""
        images = batch[0][:self.samples.num_images_save].to(device)
        with eval_mode(model):
            soft = model(images, self.temperature)["recons"]
            hard = model.decode(model.get_codebook_indices(images))
        return make_grid(torch.cat([images, soft, hard]).float().cpu(), nrow=len(images))

    def configs(self) -> dict[str, Any]:
        return {"model": self.config.to_dict(), "train": self.train.to_dict(),
                "schedule": self.schedule.to_dict(), "data": self.data}
