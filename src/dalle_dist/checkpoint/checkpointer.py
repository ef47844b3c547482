"""When a run saves, and how many saves it keeps: one object the loop asks once a step.

Modelled on torchtitan's CheckpointManager, whose save(step) owns the interval and
keep_latest_k. A run saves

- before its first step, so a bad output path or config fails in seconds (skipped when
  it resumes from its own newest checkpoint: that one is already there); once that save
  is complete, `after_first_save` runs on the root (--overwrite removes the earlier
  run's files there);
- every `every_n_steps` optimizer steps (--save_every_n_steps), except at an epoch's last
  step, where the epoch-end save follows anyway;
- when a rank was asked to stop (preemption), right after that step;
- at every epoch's end, the last of which is the end of the run.

Where it writes is the format's business (--checkpoint_format, checkpoint/formats.py): a
DeepSpeed engine keeps its optimizer partitions in `<name>-ds-cp/`
(checkpoint/deepspeed_dir.py); `sharded` has every rank write its own shards to
`<name>-sharded/` through DCP (checkpoint/sharded_dir.py), in the background with
--async_checkpoint; `full` gathers one file on the root (checkpoint/single_file.py).
`keep_n` (--keep_n_checkpoints) prunes every kind.

A DeepSpeed engine's periodic saves (every N steps, and the ends of epochs before the
last) write its tag alone: the single file `NAME.pt` beside the directory needs the whole
model on the root, a gather of every 16-bit weight under ZeRO-3, for a file a resumed run
does not read (the directory wins, checkpoint/resume.py). `NAME.pt` is written at the save
before step 1 (which also replaces an earlier run's file under --overwrite), on a stop and
at the end of the run; `dalle-dist checkpoint convert` makes one from any tag on demand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from dalle_dist.backends import DistributedBackend, Engine
from dalle_dist.checkpoint.deepspeed_dir import ds_checkpoint_dir, save_ds_checkpoint
from dalle_dist.checkpoint.format import LoopState, checkpoint_meta
from dalle_dist.checkpoint.formats import FULL, NATIVE, SHARDED
from dalle_dist.checkpoint.rng import capture_rng
from dalle_dist.checkpoint.sharded_dir import (
    PendingSave,
    save_sharded,
    sharded_checkpoint_dir,
)
from dalle_dist.checkpoint.single_file import save_single_file


class Checkpointed(Protocol):
    """What a checkpoint records of the model being trained (train.task.Task)."""

    kind: str  # "vae" or "dalle"

    def configs(self) -> dict[str, Any]: ...

    def extra_state(self) -> dict[str, Any]: ...


class Checkpointer:
    """Owns a run's save cadence and its keep-N; every rank holds one and makes the same
    calls (a save is collective)."""

    def __init__(self, path: Path, subject: Checkpointed, engine: Engine,
                 backend: DistributedBackend, *, every_n_steps: int = 0,
                 keep_n: int | None = None, save_first: bool = True,
                 after_first_save: Callable[[], None] | None = None,
                 epochs: int | None = None,
                 on_save: Callable[[int], None] | None = None,
                 checkpoint_format: str | None = None,
                 asynchronous: bool = False) -> None:
        """path: the single file `NAME.pt` (a DeepSpeed run also writes `NAME-ds-cp/`);
        every_n_steps: 0 saves at epoch ends only; keep_n: None keeps the newest single
        file and every DeepSpeed tag; save_first: False when resuming from this run's
        own newest checkpoint; epochs: the run's number of epochs, so the save after the
        last is known as the end (None: every epoch end is treated as one); on_save:
        called on the root with the step after each complete save (the loss plot is
        redrawn there), after `after_first_save` at the first; checkpoint_format: full,
        sharded or native (None: native for an engine that has its own, else full);
        asynchronous: sharded saves are written in the background (--async_checkpoint).

        Collective when asynchronous on several ranks: the background writes get a gloo
        process group of their own, created here on every rank."""
        if checkpoint_format is None:
            checkpoint_format = NATIVE if engine.has_native_checkpoint else FULL
        self.format = checkpoint_format
        self.asynchronous = asynchronous and checkpoint_format == SHARDED
        self.process_group = None
        if self.asynchronous and backend.world_size > 1:
            import torch.distributed as dist

            # its collectives run in DCP's writer thread, which the interpreter joins at
            # exit: the engine's timeout bounds them when a peer is gone
            self.process_group = dist.new_group(backend="gloo",
                                                timeout=backend.engine_timeout)
        self.pending: PendingSave | None = None
        self.path = path
        self.subject, self.engine, self.backend = subject, engine, backend
        self.every_n_steps, self.keep_n = every_n_steps, keep_n
        self.save_first, self.after_first_save = save_first, after_first_save
        self.epochs = epochs
        self.on_save = on_save

    def save(self, state: LoopState, *, periodic: bool = False, announce: bool = True) -> None:
        """Save now. Collective: every rank's RNG states go into the root's file.

        periodic: a save on the way (every N steps, an epoch end before the last): a
        DeepSpeed engine then writes its tag without the single file (module docstring).
        announce: call on_save after it (before_first_step calls it itself, later).
        """
        backend, engine = self.backend, self.engine
        self.wait()  # the previous background save first: one in flight at most
        with backend.waiting(f"the checkpoint save at step {state.step}"):
            rng = backend.all_gather_object(capture_rng(backend.device),
                                            "the RNG-state gather")
            meta = checkpoint_meta(self.subject.kind, self.subject.configs(), asdict(state),
                                   rng, backend.name, backend.world_size,
                                   precision=backend.precision_name,
                                   checkpoint_format=self.format,
                                   **self.subject.extra_state())
            if self.format == NATIVE:
                save_ds_checkpoint(engine, self.path, meta, self.keep_n,
                                   single_file=not periodic)
            elif self.format == SHARDED:
                self.pending = save_sharded(engine, self.path, meta, self.keep_n,
                                            process_group=self.process_group,
                                            asynchronous=self.asynchronous)
            else:
                save_single_file(engine, self.path, meta, self.keep_n)
            backend.barrier("the barrier after the root's write")
        if announce:
            self._announce(state)

    @property
    def location(self) -> Path:
        """What a resume or `generate` is given: the file, or the format's directory."""
        if self.format == NATIVE:
            return ds_checkpoint_dir(self.path)
        if self.format == SHARDED:
            return sharded_checkpoint_dir(self.path)
        return self.path

    def wait(self) -> None:
        """Wait until a background save is on disk and `latest` names it (nothing to wait
        for without --async_checkpoint). Called before the next save, and at the end of
        the run or a stop: a process must not exit with shards unwritten."""
        pending, self.pending = self.pending, None
        if pending is not None:
            with self.backend.waiting(f"the background save of step {pending.step}"):
                pending.wait()

    def _announce(self, state: LoopState) -> None:
        if self.on_save is not None and self.backend.is_root:
            self.on_save(state.step)

    def before_first_step(self, state: LoopState) -> None:
        """The save before training starts, then the `after_first_save` hook (root only),
        then on_save: an earlier run's files are gone by then (--overwrite)."""
        if not self.save_first:
            return
        self.save(state, announce=False)
        if self.after_first_save is not None and self.backend.is_root:
            self.after_first_save()
        self._announce(state)

    def after_step(self, state: LoopState, *, epoch_done: bool, stopping: bool) -> bool:
        """Called once after every optimizer step; True when it saved.

        epoch_done: this was the epoch's last step (its save is after_epoch's);
        stopping: a rank was asked to stop, and the loop ends after this step.
        """
        if stopping:
            self.save(state)
            return True
        if self.periodic_save_due(state.step, epoch_done=epoch_done):
            self.save(state, periodic=True)
            return True
        return False

    def periodic_save_due(self, step: int, *, epoch_done: bool) -> bool:
        """Whether after_step saves at `step` when no rank stops: the loop brings the
        numbers a checkpoint records (the epoch's loss sum) to the host before it."""
        due = bool(self.every_n_steps) and step % self.every_n_steps == 0
        return due and not epoch_done

    def after_epoch(self, state: LoopState) -> None:
        """The epoch-end save (after the epoch's scheduler step, `state.epoch` already
        counting the finished epoch); the last is the run's end."""
        self.save(state, periodic=self.epochs is not None and state.epoch < self.epochs)
