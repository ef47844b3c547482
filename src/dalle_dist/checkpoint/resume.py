"""Which checkpoint a run continues from, whether the flags agree with it, and what a
fresh run may replace.

`--resume auto` takes the newest complete checkpoint beside the output name: the
single file `<name>.pt` (always complete: it is replaced by rename), earlier ones kept by
--keep_n_checkpoints, and the DeepSpeed directory `<name>-ds-cp/` (complete up to the tag
`latest` names). The DeepSpeed directory wins a tie: it holds fp32 master weights and the
optimizer state, which the single file of a DeepSpeed run lacks.

A run that does not continue its output's own checkpoint never replaces one silently: it
stops before writing anything unless --overwrite is given, and then the earlier run's
files go only once the new run's first save is complete (`Leftovers`).

Continuing is read here too: the checkpoint, by every rank (`read_start`), and the
optimizer, scheduler, RNG and data position put back once the engine exists
(`restore_training`).

The train layer's configs and log reach this layer only through the protocols below
(`OutputFiles`, `ResumeChoice`, `Log`): imports point down (docs/design.md, "Layers").
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dalle_dist.backends import DistributedBackend, Engine
from dalle_dist.checkpoint.deepspeed_dir import (
    LATEST_FILE,
    ds_checkpoint_dir,
    is_ds_checkpoint_dir,
    load_ds_checkpoint,
    read_ds_meta,
)
from dalle_dist.checkpoint.format import KIND_NAMES, LoopState, read_checkpoint_file
from dalle_dist.checkpoint.load import load_checkpoint
from dalle_dist.checkpoint.rng import restore_rank_rng
from dalle_dist.checkpoint.single_file import HISTORY_PATTERN, history_dir
from dalle_dist.errors import CheckpointError, ConfigError
from dalle_dist.fileio import ensure_writable_file


class Log(Protocol):
    """Where a run's messages go (train.run_log.RunLog): printed on the root only."""

    def info(self, message: str) -> None: ...


class OutputFiles(Protocol):
    """What a run writes under its output name (train.config.RunPaths)."""

    @property
    def checkpoint(self) -> Path: ...

    @property
    def metrics(self) -> Path: ...

    @property
    def samples(self) -> Path: ...

    @property
    def loss_plot(self) -> Path: ...


class ResumeChoice(Protocol):
    """The resume flags (train.config.ResumeConfig)."""

    @property
    def source(self) -> str | None: ...

    @property
    def flag(self) -> str: ...

    @property
    def overwrite(self) -> bool: ...


def _position(meta: dict[str, Any]) -> tuple[int, int, int]:
    return meta["step"], meta["epoch"], meta.get("batch", 0)


def newest_checkpoint(paths: OutputFiles, log: Log) -> Path | None:
    """The newest complete checkpoint of this output name, None when there is none."""
    found: list[tuple[tuple[int, int, int], int, Path]] = []
    directory = ds_checkpoint_dir(paths.checkpoint)
    if is_ds_checkpoint_dir(directory):
        try:
            found.append((_position(read_ds_meta(directory, "--resume")), 1, directory))
        except CheckpointError as exc:
            log.info(f"warning: skipping {directory}: {exc}")
    files = [paths.checkpoint]
    folder = history_dir(paths.checkpoint)
    if folder.is_dir():
        files += sorted(p for p in folder.iterdir() if HISTORY_PATTERN.match(p.name))
    for file in files:
        if not file.is_file():
            continue
        try:
            found.append((_position(read_checkpoint_file(file, "--resume")), 0, file))
        except CheckpointError as exc:
            log.info(f"warning: skipping {file}: {exc}")
        else:
            if file == paths.checkpoint:
                break  # always the newest file: the kept ones are its earlier versions
    return max(found)[2] if found else None


def is_own_checkpoint(source: Path, paths: OutputFiles) -> bool:
    """True when `source` is this run's newest output (no need to save it again first)."""
    own = {paths.checkpoint.resolve(), ds_checkpoint_dir(paths.checkpoint).resolve()}
    return source.resolve() in own


def belongs_to_output(source: Path, paths: OutputFiles) -> bool:
    """True when `source` is one of the output's own saves (its newest, a kept earlier one,
    or its DeepSpeed directory): continuing it writes over nothing of another run."""
    source = source.resolve()
    return is_own_checkpoint(source, paths) or source.parent == history_dir(
        paths.checkpoint).resolve()


def _stores(paths: OutputFiles) -> list[Path]:
    """Where an output name keeps checkpoints, those that exist."""
    history = history_dir(paths.checkpoint)
    found = [p for p in (paths.checkpoint, ds_checkpoint_dir(paths.checkpoint)) if p.exists()]
    if history.is_dir() and any(HISTORY_PATTERN.match(p.name) for p in history.iterdir()):
        found.append(history)
    return found


def describe_existing(paths: OutputFiles, log: Log) -> str | None:
    """What the output name already holds, in words (None when it holds nothing)."""
    stores = _stores(paths)
    if not stores:
        return None
    newest = newest_checkpoint(paths, log)
    if newest is None:
        return (f"{stores[0]} already exists and is not a readable dalle_dist checkpoint, "
                "so a new run would replace it")
    meta = (read_ds_meta(newest, "--resume") if newest.is_dir()
            else read_checkpoint_file(newest, "--resume"))
    kind = KIND_NAMES.get(meta.get("kind"), "a")
    deepspeed = " (DeepSpeed directory)" if newest.is_dir() else ""
    return (f"{newest}{deepspeed} already holds {kind} checkpoint at step {meta['step']} "
            f"(epoch {meta['epoch']}), so a new run would replace it")


@dataclass
class Leftovers:
    """An earlier run's files under this output name, to remove once the run that replaces
    it (--overwrite) has saved once: until then the old checkpoint is still there.

    Files are told apart by inode and modification time: what the new run wrote is a new
    file (every save renames a fresh one into place, and a tag folder is made anew), so
    nothing of the new run is removed, even where the file system reuses a freed inode.
    (Not the change time: replacing NAME.pt changes it on the history link to its inode.)
    """

    files: list[tuple[Path, tuple[int, int]]] = field(default_factory=list)
    ds_dir: Path | None = None
    ds_latest: tuple[int, int] | None = None  # `latest`: unchanged if the new run is not DeepSpeed

    @classmethod
    def of(cls, paths: OutputFiles) -> Leftovers:
        kept = cls()
        history = history_dir(paths.checkpoint)
        candidates = [paths.metrics, paths.loss_plot]
        if history.is_dir():
            candidates += [p for p in history.iterdir() if HISTORY_PATTERN.match(p.name)]
        if paths.samples.is_dir():
            candidates += sorted(paths.samples.glob("*.png"))
        directory = ds_checkpoint_dir(paths.checkpoint)
        if directory.is_dir():
            kept.ds_dir = directory
            kept.ds_latest = _identity(directory / LATEST_FILE)
            candidates += list(directory.iterdir())
        kept.files = [(p, _identity(p)) for p in candidates if p.exists()]
        return kept

    def discard(self, log: Log) -> None:
        """Remove what is still the earlier run's; the new run's first save is complete."""
        if self.ds_dir is not None and _identity(self.ds_dir / LATEST_FILE) == self.ds_latest:
            shutil.rmtree(self.ds_dir, ignore_errors=True)  # this run is not DeepSpeed
        removed = 0
        for path, identity in self.files:
            if _identity(path) != identity:
                continue  # written by this run, or gone
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed += 1
        log.info(f"--overwrite: the earlier run's checkpoints, metrics and samples are "
                 f"removed ({removed} files or folders)")


def _identity(path: Path) -> tuple[int, int]:
    try:
        status = path.stat()
    except FileNotFoundError:
        return (-1, -1)
    return status.st_ino, status.st_mtime_ns


@dataclass(frozen=True)
class Start:
    """How a run starts, decided by the root rank alone and sent to the others (the
    output folder may exist on the root's node only)."""

    source: str | None = None  # the checkpoint to continue; None: a fresh start
    flag: str = "--resume"  # the flag that named it, for messages
    own: bool = False  # `source` is the output's own newest checkpoint (no first save)
    replaces: Leftovers | None = None  # --overwrite: the earlier run's files


def decide_start(resume: ResumeChoice, paths: OutputFiles, output_flag: str, log: Log
                 ) -> Start:
    """Where a run starts, checked before anything is written; runs on the root only."""
    ensure_writable_file(paths.checkpoint, output_flag)
    source, flag = resume.source, resume.flag
    if source:
        remove_unfinished_saves(paths, log)
    if source == "auto":
        found = newest_checkpoint(paths, log)
        if found is None:
            log.info(f"--resume auto: no checkpoint of {paths.checkpoint} yet: starting fresh")
            return Start()
        source, flag = str(found), "--resume"
    if source is not None and belongs_to_output(Path(source), paths):
        return Start(source, flag, own=is_own_checkpoint(Path(source), paths))
    existing = describe_existing(paths, log)
    replaces = None
    if existing is not None:
        if not resume.overwrite:
            raise ConfigError(existing, "continue it with --resume auto, or start over "
                                        "with --overwrite")
        replaces = Leftovers.of(paths)
        log.info(f"--overwrite: {existing} once this run's first save is complete")
    return Start(source, flag, own=False, replaces=replaces)


def remove_unfinished_saves(paths: OutputFiles, log: Log) -> None:
    """Temporary files of saves that a kill cut short (the rename never happened)."""
    for leftover in paths.checkpoint.parent.glob(f".{paths.checkpoint.name}.*.tmp"):
        log.info(f"removing an unfinished save: {leftover}")
        leftover.unlink(missing_ok=True)


def check_flags_agree(given: dict[str, Any], saved: dict[str, Any], source: str) -> None:
    """Flags given on the command line that contradict the checkpoint's config.

    A field the config does not record was added after the checkpoint was written (e.g.
    --rotary_emb): that model has the option off, so only an "on" value contradicts it."""
    differ = sorted(k for k, v in given.items()
                    if (_norm(saved[k]) != _norm(v) if k in saved else v not in (None, False)))
    if differ:
        values = ", ".join(f"{k} {_show(given[k])} (checkpoint: "
                           f"{_show(saved[k]) if k in saved else 'not recorded: off'})"
                           for k in differ)
        raise ConfigError(f"model flags contradict the checkpoint {source}: {values}",
                          "drop those flags to resume, or train a new model under another "
                          "output name")


def _norm(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _show(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


def read_start(start: Start, kind: str, backend: DistributedBackend, log: Log
               ) -> dict[str, Any] | None:
    """The checkpoint the run continues from, read by every rank (None: a fresh run);
    a single file is mapped, not read, so the ranks of a node share one copy of it
    (read_checkpoint_file).

    The deepspeed backend gets a DeepSpeed directory unconsolidated: it loads its own
    partitions (load_ds_checkpoint)."""
    if start.source is None:
        return None
    source = start.source
    payload = backend.everywhere("the checkpoint load", lambda: load_checkpoint(
        source, start.flag, kind, keep_ds_dir=backend.has_native_checkpoint))
    within = f", {payload['batch']} batches into the next" if payload.get("batch") else ""
    log.info(f"resuming {source} at step {payload['step']} (epoch {payload['epoch']}"
             f"{within})")
    payload["loaded_from"] = source
    return payload


def restore_training(payload: dict[str, Any], engine: Engine, backend: DistributedBackend,
                     batch_size: int, seed: int, log: Log) -> LoopState:
    """Optimizer, scheduler, RNG and data position of `payload`, put back on this rank.

    batch_size: this run's --batch_size (a different one moves the position inside the
    epoch); seed: --seed, for ranks the checkpoint has no RNG states of.
    Called last before the loop, so no setup step draws from the restored RNG.
    """
    why = engine.load_training_state(payload)
    if "ds_dir" in payload:
        load_ds_checkpoint(engine, payload, backend.world_size)
    if why:
        log.info(f"warning: the optimizer starts fresh ({why})")
    state = LoopState.from_checkpoint(payload)
    saved_batch = payload["configs"].get("train", {}).get("batch_size", batch_size)
    if state.batch and saved_batch != batch_size:
        state.batch = state.batch * saved_batch // batch_size
        log.info(f"warning: --batch_size {batch_size} differs from the "
                 f"checkpoint's {saved_batch}: the epoch goes on from batch {state.batch}")
    exact = restore_rank_rng(payload["rng"], backend.rank, backend.world_size,
                             seed + state.step, backend.device)
    if not exact:
        log.info(f"warning: the checkpoint was saved by {payload['world_size']} rank(s), this "
                 f"run has {backend.world_size}: random states reseeded (the run continues, "
                 "but no longer repeats an uninterrupted one exactly)")
    return state
