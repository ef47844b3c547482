"""The one training loop: forward, backward, clip, step, log, sample, save.

It is the same for the VAE and DALL-E (a Task supplies the model's inputs and schedules)
and for every backend (an Engine hides DDP, FSDP, DeepSpeed and Horovod). Every rank runs
it; only the root logs and writes files.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import nn

from dalle_dist.backends import DistributedBackend, Engine
from dalle_dist.backends.precision import dtype_names, matmul_dtypes
from dalle_dist.checkpoint.checkpointer import Checkpointer
from dalle_dist.checkpoint.format import LoopState
from dalle_dist.data import EpochLoader, WebDatasetLoader
from dalle_dist.data.images import save_png
from dalle_dist.errors import DataError, Stopped
from dalle_dist.model.init import built_on_meta
from dalle_dist.train.config import RunPaths, TrainConfig
from dalle_dist.train.preemption import stop_on_signals, stop_requested, stop_signal_name
from dalle_dist.train.run_log import RunLog
from dalle_dist.train.task import Batch, Task
from dalle_dist.train.validation import validation_due, validation_loss

if TYPE_CHECKING:  # (its type only: the loop runs without the metrics module)
    from dalle_dist.train.quality import QualityEval

T = TypeVar("T")

#: How often (in optimizer steps) the ranks agree on a stop signal when --log_every_n_steps
#: is 0; otherwise they agree at every log step.
STOP_CHECK_EVERY = 10


@dataclass
class DeviceSums:
    """The logged numbers of the steps since the last sync point, summed where they were
    computed. Adding never waits for the device; `drain` brings them to the host in one
    all-reduce and one device-to-host copy (nanoGPT reads .item() at its log interval
    only: each read stalls the GPU's queue until every kernel before it has run)."""

    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    steps: int = 0

    def add(self, values: dict[str, torch.Tensor], weight: float = 1.0) -> None:
        for name, value in values.items():
            value = value.detach().float()
            if weight != 1.0:
                value = value * weight
            self.sums[name] = value if name not in self.sums else self.sums[name] + value

    def drain(self, backend: DistributedBackend, stop: bool, device: torch.device
              ) -> tuple[dict[str, float], bool]:
        """The sums averaged over ranks (every rank's summed over its steps) and whether
        any rank was asked to stop; collective, and the one host synchronisation of the
        steps since the last call."""
        names = sorted(self.sums)
        flag = torch.tensor([float(stop)], device=device)
        packed = torch.cat([torch.stack([self.sums[n] for n in names]), flag]) if names else flag
        values = backend.average_to_host(packed, "the metrics and stop-flag all-reduce")
        self.sums, self.steps = {}, 0
        return dict(zip(names, values[:-1], strict=True)), values[-1] > 0


@dataclass
class MetricWindow:
    """Host sums of the logged numbers since the last metrics line."""

    sums: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    samples: int = 0
    started: float = field(default_factory=time.perf_counter)

    def add(self, sums: dict[str, float], steps: int, samples: int) -> None:
        for name, value in sums.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        self.steps += steps
        self.samples += samples

    def means(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self.started
        return {**{k: v / max(self.steps, 1) for k, v in self.sums.items()},
                "samples_per_s": self.samples / elapsed}


def logged_outputs(outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The numbers of one micro-batch worth logging: the loss and the model's scalar parts."""
    return {k: v for k, v in outputs.items() if isinstance(v, torch.Tensor) and v.ndim == 0}


def inference_model(task: Task, engine: Engine, backend: DistributedBackend) -> nn.Module | None:
    """The model with all its weights on the root rank, None elsewhere.

    Collective when the engine shards parameters (FSDP, ZeRO-3): every rank must call it.
    """
    if not engine.shards_parameters:
        return engine.module if backend.is_root else None
    model = task.build_model()
    state = engine.inference_state_dict(model)  # (with the EMA where it is not swapped in)
    if not backend.is_root:
        return None
    if built_on_meta(model):
        # The gathered CPU tensors become the weights: no second full copy is allocated
        # (fp32 ones are moved as they are; 16-bit ones, DeepSpeed fp16's, are cast).
        model.load_state_dict(state, assign=True)
        return model.to(backend.device, torch.float32)
    model = model.to(backend.device)
    model.load_state_dict(state)
    return model


def on_inference_model(task: Task, engine: Engine, backend: DistributedBackend, what: str,
                       work: Callable[[nn.Module], T]) -> T | None:
    """`work(model)` with the weights sampling uses (the EMA with --ema_decay), drawn on a
    forked RNG: how often samples are taken must not change the random numbers training
    sees (or a resumed run would diverge). The fork covers building the inference copy
    too: initialising its weights draws from the RNG. Its result on the root, None
    elsewhere. Collective: an engine that samples through its shards runs `work` on every
    rank (the same calls, so the same gathers); the others gather the weights to the
    root, which works alone."""
    device = backend.device
    with (torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
          engine.ema_applied()):  # --ema_decay: drawn with the average
        if engine.samples_sharded:
            with backend.waiting(what):
                result = work(engine.module)
                engine.end_sampling()
            return result if backend.is_root else None
        with backend.waiting(what):
            model = inference_model(task, engine, backend)
        if model is None:
            return None
        with engine.working_alone():
            return work(model)


def write_samples(task: Task, engine: Engine, backend: DistributedBackend, batch: Batch,
                  path: Path, log: RunLog | None = None, step: int = 0) -> None:
    """A sample grid for `batch`'s captions (on_inference_model), written by the root;
    the PNG goes to the log's trackers as the image "samples" at `step`."""
    grid = on_inference_model(task, engine, backend, f"the sample grid {path.name}",
                              lambda model: task.sample_grid(model, batch, backend.device))
    if grid is None:
        return
    with engine.working_alone():
        save_png(grid, path)
        if log is not None:
            log.image("samples", path, step)


def evaluate_quality(task: Task, engine: Engine, backend: DistributedBackend,
                     quality: QualityEval, path: Path, log: RunLog, step: int
                     ) -> dict[str, float] | None:
    """--eval_every_n_steps: one image per evaluation caption (on_inference_model), the
    grid of them written to `path`, their metrics (train/quality.py) on the root; None
    elsewhere."""
    device = backend.device
    images = on_inference_model(task, engine, backend, f"the evaluation at step {step}",
                                lambda model: quality.sample(model, device))
    if images is None:
        return None
    with engine.working_alone():
        save_png(quality.grid(images), path)
        log.image("evaluation", path, step)
        return quality.score(images, device)


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


def _watch_compile(task: Task, step: int, first: bool, device: torch.device, log: RunLog
                   ) -> contextlib.AbstractContextManager[None]:
    """--compile: this process's first step runs eager, the next (which compiles) and the
    one after it are timed, and the compile time logged once (train/compile.py); nothing
    otherwise."""
    if task.compiled is None:
        return contextlib.nullcontext()
    if first:
        return task.compiled.eager()
    return task.compiled.timing(step, device, log.info)


def optimizer_step(task: Task, engine: Engine, backend: DistributedBackend,
                   micro_batches: list[Batch], config: TrainConfig, sums: DeviceSums,
                   step: int) -> None:
    """One optimizer step over its micro-batches (--ga_steps of them), its numbers added to
    `sums` on the device: nothing here waits for the device or reads a value back."""
    last = len(micro_batches) - 1
    # Every wait for the other ranks is bounded and named (backends/watch.py).
    with backend.waiting(f"step {step}"):
        with backend.waiting("the forward and backward pass"):
            for index, batch in enumerate(micro_batches):
                with engine.micro_batch(last=index == last):
                    outputs = engine.forward(*task.inputs(batch, backend.device))
                    engine.backward(outputs["loss"])
                sums.add(logged_outputs(outputs), 1.0 / len(micro_batches))
        with backend.waiting("the optimizer step"):
            grad_norm = engine.clip_and_step(config.clip_grad_norm)
            engine.zero_grad()
            if engine.ema is not None:  # device work on this rank's own values
                engine.ema.update(step)
    if grad_norm is not None:
        sums.add({"grad_norm": grad_norm})
    sums.steps += 1


def train(task: Task, engine: Engine, backend: DistributedBackend,
          data: EpochLoader | WebDatasetLoader,
          config: TrainConfig, paths: RunPaths, log: RunLog,
          state: LoopState | None = None, checkpointer: Checkpointer | None = None,
          val_every_n_steps: int = 0, quality: QualityEval | None = None) -> LoopState:
    """Train from `state` to the last epoch; raises Stopped after saving if signalled.

    When `data.held_out` holds a validation part (--val_fraction), its loss is measured
    at each epoch end and every `val_every_n_steps` optimizer steps (0: epoch ends only),
    logged as a metrics record {step, epoch, val_loss}; the sample grids then draw their
    captions from it. quality: --eval_every_n_steps's evaluation, logged as a record
    {step, epoch, fid, clip_score, caption_fidelity} (those it measures) at its cadence
    and at the last step.

    checkpointer: when and how often to save (checkpoint/checkpointer.py); by default one
    that saves before the first step, every --save_every_n_steps, at each epoch end and
    on a stop, to paths.checkpoint.
    SIGTERM and SIGINT are recorded while it runs (train/preemption.py); before, during
    set-up, they end the process as usual: there is nothing to save yet.
    """
    checkpointer = checkpointer or Checkpointer(paths.checkpoint, task, engine, backend,
                                                every_n_steps=config.save_every_n_steps,
                                                epochs=config.epochs)
    try:
        with stop_on_signals():
            return _train(task, engine, backend, data, config, paths, log,
                          state or LoopState(), checkpointer, val_every_n_steps, quality)
    finally:
        log.end_progress()  # an error line printed next starts on a line of its own


def steps_per_epoch(micro_batches: int, ga_steps: int) -> int:
    """Optimizer steps in an epoch of `micro_batches` loader batches: each step takes
    --ga_steps of them, and a last partial window is left out (as drop_last). The loop, the
    LR schedule's length and train's headline all count these."""
    return micro_batches // ga_steps


def _train(task: Task, engine: Engine, backend: DistributedBackend,
           data: EpochLoader | WebDatasetLoader, config: TrainConfig, paths: RunPaths,
           log: RunLog, state: LoopState, checkpointer: Checkpointer,
           val_every_n_steps: int = 0, quality: QualityEval | None = None) -> LoopState:
    """One optimizer step = --ga_steps micro-batches. The step itself never waits for the
    device: its numbers stay there (DeviceSums) until a sync point, a log step, a save, an
    epoch's end or a stop check, brings them over in one all-reduce."""
    device, ga = backend.device, engine.ga_steps
    epoch_steps = steps_per_epoch(len(data), ga)
    if epoch_steps == 0:
        raise DataError(f"an epoch holds {len(data)} micro-batches per rank, fewer than "
                        f"--ga_steps {ga}", "lower --ga_steps or --batch_size, or add data")
    samples_per_step = data.batch_size * backend.world_size * ga
    stop_every = config.log_every_n_steps or STOP_CHECK_EVERY
    checkpointer.before_first_step(state)
    log.start_progress(config.epochs * epoch_steps, state.step, f"train {task.kind}")
    device_sums, window = DeviceSums(), MetricWindow()
    first_step = state.step
    held_out = getattr(data, "held_out", None)
    grid_batch: Batch | None = None  # the held-out batch every sample grid is drawn for

    for epoch in range(state.epoch, config.epochs):
        micro_batches = iter(data.epoch(epoch, start=state.batch))
        epoch_end = epoch_steps * ga  # a last partial window is left out, as drop_last
        while state.batch < epoch_end:
            window_batches = list(itertools.islice(micro_batches, ga))
            first = state.step == first_step
            step_lr = engine.lr  # the rate this step takes (a host float: no sync)
            with (_watch_precision(engine, backend, log, first),
                  _watch_compile(task, state.step + 1, first, device, log)):
                optimizer_step(task, engine, backend, window_batches, config, device_sums,
                               state.step + 1)
            state.step += 1
            state.batch += ga
            state.samples = (state.samples or 0) + samples_per_step
            task.after_step(state.step, engine)

            epoch_done = state.batch >= epoch_end
            log_due = bool(config.log_every_n_steps) and state.step % config.log_every_n_steps == 0
            local_stop = stop_requested()
            stop, shown = False, {}
            if (log_due or epoch_done or state.step % stop_every == 0
                    or checkpointer.periodic_save_due(state.step, epoch_done=epoch_done)
                    or (local_stop and backend.world_size == 1)):  # (one process: no vote)
                steps = device_sums.steps
                sums, stop = device_sums.drain(backend, local_stop, device)
                state.loss_sum += sums.get("loss", 0.0)
                window.add(sums, steps, steps * samples_per_step)
                shown = {"loss": sums.get("loss", 0.0) / steps}

            if log_due:
                scale = engine.loss_scale
                log.metrics({"step": state.step, "epoch": epoch, **window.means(),
                             "lr": step_lr, **task.step_metrics(state.step),
                             **({"loss_scale": scale} if scale is not None else {})})
                window = MetricWindow()
            if held_out is not None and validation_due(val_every_n_steps, state.step,
                                                       epoch_done):
                # a sync point of its own, at its cadence only: one all-reduce per pass
                log.metrics({"step": state.step, "epoch": epoch,
                             "val_loss": validation_loss(task, engine, backend, held_out)})
            last = epoch_done and epoch == config.epochs - 1
            if quality is not None and quality.due(state.step, last):
                record = evaluate_quality(task, engine, backend, quality, paths.samples
                                          / f"eval-step-{state.step:07d}.png", log, state.step)
                if record is not None:
                    log.metrics({"step": state.step, "epoch": epoch, **record})
            if config.sample_every_n_steps and state.step % config.sample_every_n_steps == 0:
                if held_out is not None and grid_batch is None and backend.is_root:
                    grid_batch = held_out.first_batch()
                write_samples(task, engine, backend, grid_batch or window_batches[-1],
                              paths.samples / f"step-{state.step:07d}.png", log, state.step)
            checkpointer.after_step(state, epoch_done=epoch_done, stopping=stop)
            log.progress(**shown)  # the step's end (tests/backends/sync_probe.py counts on it)
            if stop:
                log.end_progress()
                signal_name = stop_signal_name() or "another rank's signal"
                raise Stopped(f"stopped by {signal_name} after step {state.step}: saved "
                              f"{checkpointer.location}; continue with the same command and "
                              "--resume auto" if backend.is_root else "")

        task.after_epoch(epoch, state.loss_sum / epoch_steps, engine)
        state.epoch, state.batch, state.loss_sum, state.samples = epoch + 1, 0, 0.0, 0
        checkpointer.after_epoch(state)

    log.end_progress()
    if task.compiled is not None:
        task.compiled.finish(log.info)
    check_replicas(engine, backend, log)
    return state
