"""Sharded checkpoints (`NAME-sharded/`): every rank writes its own shards through
torch.distributed.checkpoint (DCP), and a resumed run reads back only what its ranks hold,
resharded by DCP to their number (docs/checkpoints.md, "Sharded checkpoints").

Layout:

    NAME-sharded/
      latest              the newest complete save's folder name, written last
      step-0000040/       one save: DCP's `.metadata` and one `__R_0.distcp` per rank,
        meta.pt           and ours: configs, position, every rank's RNG, scheduler, loss
                          scale, the VAE a DALL-E carries (no transformer weights)

A save is complete-or-absent, as a single file's is: `latest` moves only once every rank's
files and DCP's `.metadata` are on disk, so a save cut short leaves `latest` naming the
previous one, which a resume takes; the next save removes the unfinished folder. keep-N
keeps the newest N folders (one without --keep_n_checkpoints).

--async_checkpoint: each rank copies its shards to host memory, and DCP writes them from a
background thread over a process group of its own (gloo), while the step loop goes on.
The next save, the end of the run and a stop first wait for it; `latest` moves when it
is complete. No weight ever travels to rank 0, in either mode.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dalle_dist.checkpoint.format import read_checkpoint_file, write_checkpoint_file
from dalle_dist.errors import CheckpointError
from dalle_dist.fileio import atomic_writer

if TYPE_CHECKING:
    from dalle_dist.backends import Engine

META_FILE = "meta.pt"
LATEST_FILE = "latest"
SAVE_PATTERN = re.compile(r"step-(\d+)(?:-(\d+))?$")


def sharded_checkpoint_dir(path: str | Path) -> Path:
    """`dalle.pt` -> `dalle-sharded/`."""
    path = Path(path)
    return path.with_name(f"{path.stem}-sharded")


def save_order(name: str) -> tuple[int, int] | None:
    match = SAVE_PATTERN.match(name)
    return (int(match.group(1)), int(match.group(2) or 0)) if match else None


def current_save(directory: Path) -> str | None:
    latest = directory / LATEST_FILE
    return latest.read_text(encoding="utf-8").strip() if latest.is_file() else None


def is_sharded_dir(path: str | Path) -> bool:
    """A folder whose `latest` names a `step-N` save, or that holds one (a first save
    cut short), or one save's folder itself (an earlier save kept by keep-N): not a
    DeepSpeed directory, whose tags are `global_stepN`."""
    path = Path(path)
    if not path.is_dir():
        return False
    if (path / META_FILE).is_file():
        return True
    latest = current_save(path)
    if latest is not None:
        return save_order(latest) is not None
    return any(p.is_dir() and save_order(p.name) for p in path.iterdir())


def new_save_name(directory: Path, step: int) -> str:
    """`step-000000N`, or `step-000000N-1` ... when `latest` names that one already (the
    epoch-end save right after a stop at the epoch's last step): a published save is
    never written over."""
    name, published, k = f"step-{step:07d}", current_save(directory), 0
    while name == published:
        k += 1
        name = f"step-{step:07d}-{k}"
    return name


def latest_save(directory: Path, flag: str) -> Path:
    """The save `latest` names; it is complete because `latest` is written after it.
    Given one save's folder (`NAME-sharded/step-N`), that save, if it is complete."""
    if (directory / META_FILE).is_file():
        if not is_complete(directory):
            raise CheckpointError(f"{flag} {directory} is a save that never finished (no DCP "
                                  ".metadata)", "use an earlier save, or the directory "
                                  "above it: its `latest` names the newest complete one")
        return directory
    name = current_save(directory)
    if name is None:
        raise CheckpointError(f"{flag} {directory} has no '{LATEST_FILE}' file: no save of it "
                              "finished", "use an earlier checkpoint or train from scratch")
    if not (directory / name / META_FILE).is_file():
        raise CheckpointError(f"{flag} {directory}: '{LATEST_FILE}' names {name!r}, which is "
                              "missing or incomplete", "the directory is damaged; use "
                              "another checkpoint")
    return directory / name


def read_sharded_meta(directory: str | Path, flag: str) -> dict[str, Any]:
    """Our metadata of the newest complete save, with `sharded_dir` (that save's folder)
    added; no tensor of the model or optimizer is read."""
    folder = latest_save(Path(directory), flag)
    meta = read_checkpoint_file(folder / META_FILE, flag)
    return {**meta, "sharded_dir": str(folder)}


def saved_keys(folder: str | Path) -> set[str]:
    """The top-level entries DCP saved ("model", and "optim" after the first step)."""
    from dalle_dist.checkpoint.dcp_io import read_metadata

    return {key.split(".", 1)[0] for key in read_metadata(folder).state_dict_metadata}


def read_sharded_whole(directory: str | Path, flag: str, with_optimizer: bool = True
                       ) -> dict[str, Any]:
    """The newest save as a single file's payload (whole fp32 weights, the optimizer keyed
    by parameter name), read in this process alone: for `convert`, `verify`, `generate`
    and the engines that cannot load DCP shards (DeepSpeed, Horovod). It holds the whole
    state in host memory, as a single file's reader does."""
    from dalle_dist.checkpoint.dcp_io import read_whole

    meta = read_sharded_meta(directory, flag)
    folder = meta.pop("sharded_dir")
    keys = {"model", "optim", "ema"} if with_optimizer else {"model", "ema"}
    state = read_whole(folder, keys & saved_keys(folder))
    ema = {"ema_weights": state["ema"]} if "ema" in state else {}
    return {**meta, "weights": state.get("model", {}), "optimizer": state.get("optim"), **ema}


def write_sharded(directory: Path, payload: dict[str, Any]) -> str:
    """A single file's payload as a sharded directory of one save, written by this process
    alone (`checkpoint convert`); returns the save's name. The optimizer state, keyed by
    parameter name, is DCP's form already: any number of ranks loads it resharded."""
    from torch.distributed.checkpoint import FileSystemWriter, save

    name = f"step-{payload.get('step', 0):07d}"
    folder = directory / name
    folder.mkdir(parents=True)
    state: dict[str, Any] = {"model": payload["weights"]}
    if payload.get("optimizer"):
        state["optim"] = payload["optimizer"]
    if payload.get("ema_weights"):
        state["ema"] = payload["ema_weights"]
    meta = {k: v for k, v in payload.items() if k not in ("weights", "optimizer", "ema_weights")}
    write_checkpoint_file(folder / META_FILE, {**meta, "checkpoint_format": "sharded"})
    from dalle_dist.checkpoint.dcp_io import one_process

    with one_process():
        save(state, storage_writer=FileSystemWriter(str(folder), sync_files=True),
             no_dist=True)
    publish_save(directory, name, None)
    return name


def load_into_engine(engine: Engine, folder: str | Path) -> set[str]:
    """The model and optimizer state of one save, and its EMA where both the save and the
    engine have one, into a running engine, each rank reading only the shards it holds
    (DCP reshards to this run's world size). Collective. Returns what it loaded of
    "model", "optim" (none before the first step) and "ema"."""
    from torch.distributed.checkpoint import load

    from dalle_dist.checkpoint.dcp_io import SafeLoadPlanner, SafeReader, dcp_errors

    saved = saved_keys(folder)
    state = engine.sharded_state(with_optimizer="optim" in saved, with_ema="ema" in saved)
    with dcp_errors(f"--resume {folder} could not be loaded into this model",
                    "resume with the model flags it was saved with"):
        load(state, storage_reader=SafeReader(str(folder)), planner=SafeLoadPlanner())
    engine.load_sharded_state(state)
    return set(state)


def publish_save(directory: Path, name: str, keep_n: int | None) -> None:
    """Make `name` the newest: its files fsynced, `latest` replaced atomically, then the
    other saves beyond the newest keep_n (1 when None) removed, unfinished ones too."""
    for file in (directory / name).iterdir():
        if file.is_file():
            with open(file, "rb") as f:
                os.fsync(f.fileno())
    with atomic_writer(directory / LATEST_FILE) as f:
        f.write(name.encode())
    saves = sorted((p for p in directory.iterdir() if p.is_dir() and save_order(p.name)),
                   key=lambda p: save_order(p.name) or (0, 0), reverse=True)
    keep = [p for p in saves if p.name == name or is_complete(p)]
    kept = {p.name for p in keep[:keep_n or 1]} | {name}
    for old in saves:
        if old.name not in kept:
            shutil.rmtree(old, ignore_errors=True)


def is_complete(folder: Path) -> bool:
    """Our metadata and DCP's are both there (DCP writes its `.metadata` last)."""
    return (folder / META_FILE).is_file() and (folder / ".metadata").is_file()


class PendingSave:
    """An --async_checkpoint save in flight on this rank. The root publishes it (moves
    `latest`) once DCP's future is done: from the background thread as soon as it is,
    or in `wait`, whichever comes first, never twice."""

    def __init__(self, future: Future, step: int, publish: Any | None) -> None:
        self.future, self.step, self._publish = future, step, publish
        self._lock = threading.Lock()
        if publish is not None:
            future.add_done_callback(lambda _: self._publish_once())

    def _publish_once(self) -> None:
        with self._lock:
            if self._publish is None or self.future.exception() is not None:
                return
            publish, self._publish = self._publish, None
            publish()

    def wait(self) -> None:
        """Block until the save is on disk and published; a failed one raises."""
        from torch.distributed.checkpoint.api import CheckpointException

        from dalle_dist.checkpoint.dcp_io import dcp_failure

        try:
            self.future.result()
        except (Exception, CheckpointException) as exc:
            raise CheckpointError(f"the background save of step {self.step} failed "
                                  f"({dcp_failure(exc)[1]})",
                                  "the previous checkpoint is still complete; check the "
                                  "disk and resume with --resume auto") from None
        self._publish_once()


def save_sharded(engine: Engine, path: Path, meta: dict[str, Any], keep_n: int | None, *,
                 process_group: Any = None, asynchronous: bool = False
                 ) -> PendingSave | None:
    """Every rank writes its shards of the model and optimizer to a new save folder of
    `NAME-sharded/`, the root our metadata; `latest` is written last (now, or when an
    asynchronous save completes: the PendingSave returned). Collective.

    process_group: the group DCP coordinates an asynchronous save over (its own, so the
    background thread's collectives never interleave with the training step's)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint import FileSystemWriter, async_save, save

    distributed = dist.is_available() and dist.is_initialized()
    directory = sharded_checkpoint_dir(path)
    # The root names the save for all: `latest` may be on rank 0's disk only.
    box = [new_save_name(directory, meta["step"]) if engine.is_root else None]
    if distributed:
        dist.broadcast_object_list(box, src=0)
    name = box[0]
    folder = directory / name
    state = engine.sharded_state(with_optimizer=bool(engine.optimizer.state))
    if engine.is_root:
        with engine.working_alone():
            if folder.exists():
                shutil.rmtree(folder)  # left by a save that never finished
            folder.mkdir(parents=True)
            write_checkpoint_file(folder / META_FILE, {**meta, **engine.training_state()})
    if distributed:
        dist.barrier()  # the folder exists before any rank writes into it
    writer = FileSystemWriter(str(folder), sync_files=True)
    if asynchronous:
        future = async_save(state, storage_writer=writer, process_group=process_group)
        publish = (lambda: publish_save(directory, name, keep_n)) if engine.is_root else None
        return PendingSave(future, meta["step"], publish)
    save(state, storage_writer=writer)
    if distributed:
        dist.barrier()  # every rank's files are written (DCP's .metadata: by the root)
    if engine.is_root:
        with engine.working_alone():
            publish_save(directory, name, keep_n)
    return None
