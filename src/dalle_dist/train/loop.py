"""The one training loop: forward, backward, clip, step, log, sample, save.

It is the same for the VAE and DALL-E (a Task supplies the model's inputs and schedules)
and for every backend (an Engine hides DDP, FSDP, DeepSpeed and Horovod).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dalle_dist.backends import DistributedBackend, Engine
from dalle_dist.data.images import save_png
from dalle_dist.train.checkpoint import checkpoint_meta
from dalle_dist.train.config import RunPaths, TrainConfig
from dalle_dist.train.run_log import RunLog
from dalle_dist.train.task import Batch, Task


@dataclass
class LoopState:
    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps taken


@dataclass
class MetricWindow:
    """Sums of the logged numbers since the last metrics line."""

    sums: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    samples: int = 0
    started: float = field(default_factory=time.perf_counter)

    def add(self, values: dict[str, float], samples: int) -> None:
        for name, value in values.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        self.steps += 1
        self.samples += samples

    def means(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self.started
        return {**{k: v / self.steps for k, v in self.sums.items()},
                "samples_per_s": self.samples / elapsed}


def step_scalars(outputs: dict[str, torch.Tensor], loss: float,
                 grad_norm: float | None) -> dict[str, float]:
    """The numbers of one step worth logging: the rank-averaged loss and the model's parts."""
    values = {k: float(v) for k, v in outputs.items()
              if k != "loss" and isinstance(v, torch.Tensor) and v.ndim == 0}
    values["loss"] = loss
    if grad_norm is not None:
        values["grad_norm"] = grad_norm
    return values


def write_samples(task: Task, batch: Batch, device: torch.device, path: Path) -> None:
    """A sample grid, drawn on a forked RNG: how often samples are taken must not change
    the random numbers training sees (or a resumed run would diverge)."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        save_png(task.sample_grid(batch, device), path)


def save_checkpoint(task: Task, engine: Engine, backend: DistributedBackend, paths: RunPaths,
                    state: LoopState) -> None:
    if backend.is_root:
        meta = checkpoint_meta(task.kind, task.configs(), state.epoch, state.step,
                               backend.name, backend.world_size, **task.extra_state())
        engine.save(paths.checkpoint, meta)
    backend.barrier()


def train(task: Task, engine: Engine, backend: DistributedBackend,
          loader: Iterable[Batch], steps_per_epoch: int, config: TrainConfig,
          paths: RunPaths, log: RunLog, state: LoopState | None = None) -> LoopState:
    state = state or LoopState()
    device = backend.device
    # Save before the first step, so a bad output path or config fails in seconds.
    save_checkpoint(task, engine, backend, paths, state)
    log.start_progress(config.epochs * steps_per_epoch, state.step, f"train {task.kind}")
    window = MetricWindow()

    for epoch in range(state.epoch, config.epochs):
        epoch_loss, epoch_batches = 0.0, 0
        for batch in loader:
            outputs = engine.forward(*task.inputs(batch, device))
            engine.backward(outputs["loss"])
            grad_norm = engine.clip_grad_norm(config.clip_grad_norm)
            engine.step()
            engine.zero_grad()
            state.step += 1
            task.after_step(state.step)

            loss = float(backend.average(outputs["loss"].detach()))  # the same on every rank
            epoch_loss, epoch_batches = epoch_loss + loss, epoch_batches + 1
            window.add(step_scalars(outputs, loss, grad_norm), len(batch[0]) * backend.world_size)
            log.progress(loss=loss)

            if config.log_every_n_steps and state.step % config.log_every_n_steps == 0:
                log.metrics({"step": state.step, "epoch": epoch, **window.means(),
                             "lr": engine.lr, **task.step_metrics(state.step)})
                window = MetricWindow()
            if config.sample_every_n_steps and state.step % config.sample_every_n_steps == 0:
                if backend.is_root:
                    write_samples(task, batch, device, paths.samples / f"step-{state.step:07d}.png")
            if config.save_every_n_steps and state.step % config.save_every_n_steps == 0:
                save_checkpoint(task, engine, backend, paths, state)

        task.after_epoch(epoch, epoch_loss / max(epoch_batches, 1))
        state.epoch = epoch + 1
        save_checkpoint(task, engine, backend, paths, state)

    log.end_progress()
    return state
