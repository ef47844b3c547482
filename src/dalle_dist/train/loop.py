"""The one training loop: forward, backward, clip, step, log, sample, save.

It is the same for the VAE and DALL-E (a Task supplies the model's inputs and schedules)
and for every backend (an Engine hides DDP, FSDP, DeepSpeed and Horovod). Every rank runs
it; only the root logs and writes files.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from dalle_dist.backends import DistributedBackend, Engine
from dalle_dist.backends.precision import dtype_names, matmul_dtypes
from dalle_dist.checkpoint.checkpointer import Checkpointer
from dalle_dist.checkpoint.format import LoopState
from dalle_dist.data import EpochLoader, WebDatasetLoader
from dalle_dist.data.images import save_png
from dalle_dist.errors import Stopped
from dalle_dist.train.config import RunPaths, TrainConfig
from dalle_dist.train.preemption import stop_on_signals, stop_requested, stop_signal_name
from dalle_dist.train.run_log import RunLog
from dalle_dist.train.task import Batch, Task


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


def inference_model(task: Task, engine: Engine, backend: DistributedBackend) -> nn.Module | None:
    """The model with all its weights on the root rank, None elsewhere.

    Collective when the engine shards parameters (FSDP, ZeRO-3): every rank must call it.
    """
    if not engine.shards_parameters:
        return engine.module if backend.is_root else None
    state = engine.full_state_dict()
    if not backend.is_root:
        return None
    model = task.build_model().to(backend.device)
    model.load_state_dict(state)
    return model


def write_samples(task: Task, engine: Engine, backend: DistributedBackend, batch: Batch,
                  path: Path) -> None:
    """A sample grid, drawn on a forked RNG: how often samples are taken must not change
    the random numbers training sees (or a resumed run would diverge). The fork covers
    building the inference copy too: initialising its weights draws from the RNG."""
    device = backend.device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        with backend.waiting(f"the sample grid {path.name}"):
            model = inference_model(task, engine, backend)
        if model is None:
            return
        with engine.working_alone():
            save_png(task.sample_grid(model, batch, device), path)


def check_replicas(engine: Engine, backend: DistributedBackend, log: RunLog) -> list[str]:
    """Every rank's parameter digest; the log says whether all ranks hold the same model.

    Sharded engines hash each rank's own shard, so their line lists the shards' digests
    and claims no agreement (equal digests there would mean nothing was sharded)."""
    with backend.waiting("the parameter comparison at the end"):
        digests = backend.all_gather_object(engine.rank_digest(), "the digest gather")
    if engine.shards_parameters:
        log.info(f"parameters sharded over {len(digests)} rank(s): shard digests "
                 f"{' '.join(digests)}")
    elif len(set(digests)) == 1:
        log.info(f"parameters identical on {len(digests)} rank(s): digest {digests[0]}")
    else:
        log.info(f"warning: ranks hold different parameters: {', '.join(digests)}")
    return digests


@contextlib.contextmanager
def _watch_precision(engine: Engine, backend: DistributedBackend, log: RunLog,
                     first: bool) -> Iterator[None]:
    """On this process's first step, log the dtype the model's matmuls really ran in."""
    if not first:
        yield
        return
    with matmul_dtypes(engine.module) as seen:
        yield
    log.info(f"precision {backend.precision_name}: the first step's matmuls ran in "
             f"{dtype_names(seen)}")


def loss_and_stop(loss: torch.Tensor, backend: DistributedBackend) -> tuple[float, bool]:
    """The loss averaged over ranks and whether any rank was asked to stop, in one
    all-reduce, so every rank stops at the same step."""
    pair = torch.stack([loss.detach().float(),
                        torch.tensor(float(stop_requested()), device=loss.device)])
    loss_mean, stop = backend.average(pair, "the loss all-reduce").tolist()
    return loss_mean, stop > 0


def train(task: Task, engine: Engine, backend: DistributedBackend,
          data: EpochLoader | WebDatasetLoader,
          config: TrainConfig, paths: RunPaths, log: RunLog,
          state: LoopState | None = None, checkpointer: Checkpointer | None = None
          ) -> LoopState:
    """Train from `state` to the last epoch; raises Stopped after saving if signalled.

    checkpointer: when and how often to save (checkpoint/checkpointer.py); by default one
    that saves before the first step, every --save_every_n_steps, at each epoch end and
    on a stop, to paths.checkpoint.
    SIGTERM and SIGINT are recorded while it runs (train/preemption.py); before, during
    set-up, they end the process as usual: there is nothing to save yet.
    """
    checkpointer = checkpointer or Checkpointer(paths.checkpoint, task, engine, backend,
                                                every_n_steps=config.save_every_n_steps)
    try:
        with stop_on_signals():
            return _train(task, engine, backend, data, config, paths, log,
                          state or LoopState(), checkpointer)
    finally:
        log.end_progress()  # an error line printed next starts on a line of its own


def _train(task: Task, engine: Engine, backend: DistributedBackend,
           data: EpochLoader | WebDatasetLoader, config: TrainConfig, paths: RunPaths,
           log: RunLog, state: LoopState, checkpointer: Checkpointer) -> LoopState:
    device = backend.device
    samples_per_step = data.batch_size * backend.world_size
    checkpointer.before_first_step(state)
    log.start_progress(config.epochs * len(data), state.step, f"train {task.kind}")
    window = MetricWindow()
    first_step = state.step

    for epoch in range(state.epoch, config.epochs):
        for batch in data.epoch(epoch, start=state.batch):
            # Every wait for the other ranks is bounded and named (backends/watch.py).
            with backend.waiting(f"step {state.step + 1}"):
                with backend.waiting("the forward and backward pass"), \
                        _watch_precision(engine, backend, log, state.step == first_step):
                    outputs = engine.forward(*task.inputs(batch, device))
                    engine.backward(outputs["loss"])
                with backend.waiting("the optimizer step"):
                    grad_norm = engine.clip_and_step(config.clip_grad_norm)
                    engine.zero_grad()
                state.step += 1
                task.after_step(state.step, engine)
                loss, stop = loss_and_stop(outputs["loss"], backend)  # the same everywhere
            state.batch, state.loss_sum = state.batch + 1, state.loss_sum + loss
            window.add(step_scalars(outputs, loss, grad_norm), samples_per_step)
            log.progress(loss=loss)

            if config.log_every_n_steps and state.step % config.log_every_n_steps == 0:
                scale = engine.loss_scale
                log.metrics({"step": state.step, "epoch": epoch, **window.means(),
                             "lr": engine.lr, **task.step_metrics(state.step),
                             **({"loss_scale": scale} if scale is not None else {})})
                window = MetricWindow()
            if config.sample_every_n_steps and state.step % config.sample_every_n_steps == 0:
                write_samples(task, engine, backend, batch,
                              paths.samples / f"step-{state.step:07d}.png")
            checkpointer.after_step(state, epoch_done=state.batch >= len(data), stopping=stop)
            if stop:
                log.end_progress()
                signal_name = stop_signal_name() or "another rank's signal"
                raise Stopped(f"stopped by {signal_name} after step {state.step}: saved "
                              f"{paths.checkpoint}; continue with the same command and "
                              "--resume auto" if backend.is_root else "")

        task.after_epoch(epoch, state.loss_sum / max(state.batch, 1), engine)
        state.epoch, state.batch, state.loss_sum = epoch + 1, 0, 0.0
        checkpointer.after_epoch(state)

    log.end_progress()
    check_replicas(engine, backend, log)
    return state
