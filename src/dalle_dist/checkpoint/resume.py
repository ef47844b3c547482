"""Which checkpoint a run continues from, whether the flags agree with it, and what a
fresh run may replace.

`--resume auto` takes the newest complete checkpoint beside the output name: the
single file `<name>.pt` (always complete: it is replaced by rename), earlier ones kept by
--keep_n_checkpoints, the sharded directory `<name>-sharded/` and the DeepSpeed directory
`<name>-ds-cp/` (each complete up to the save `latest` names). A directory wins a tie
with the file: the DeepSpeed one holds fp32 master weights and the optimizer state, which
the single file of a DeepSpeed run lacks.

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
    EMA_FOLDER,
    LATEST_FILE,
    ds_checkpoint_dir,
    is_ds_checkpoint_dir,
    load_ds_checkpoint,
    load_ema_shards,
    read_ds_meta,
)
from dalle_dist.checkpoint.format import KIND_NAMES, LoopState, read_checkpoint_file
from dalle_dist.checkpoint.load import load_checkpoint
from dalle_dist.checkpoint.rng import restore_rank_rng
from dalle_dist.checkpoint.sharded_dir import (
    is_sharded_dir,
    load_into_engine,
    read_sharded_meta,
    sharded_checkpoint_dir,
)
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
    for directory, is_kind, read_meta in (
            (ds_checkpoint_dir(paths.checkpoint), is_ds_checkpoint_dir, read_ds_meta),
            (sharded_checkpoint_dir(paths.checkpoint), is_sharded_dir, read_sharded_meta)):
        if not is_kind(directory):
            continue
        try:
            found.append((_position(read_meta(directory, "--resume")), 1, directory))
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
    own = {paths.checkpoint.resolve(), ds_checkpoint_dir(paths.checkpoint).resolve(),
           sharded_checkpoint_dir(paths.checkpoint).resolve()}
    return source.resolve() in own


def belongs_to_output(source: Path, paths: OutputFiles) -> bool:
    """True when `source` is one of the output's own saves (its newest, a kept earlier one,
    a save of its sharded directory, or its DeepSpeed directory): continuing it writes
    over nothing of another run."""
    source = source.resolve()
    kept = {history_dir(paths.checkpoint).resolve(),
            sharded_checkpoint_dir(paths.checkpoint).resolve()}
    return is_own_checkpoint(source, paths) or source.parent in kept


def _stores(paths: OutputFiles) -> list[Path]:
    """Where an output name keeps checkpoints, those that exist."""
    history = history_dir(paths.checkpoint)
    found = [p for p in (paths.checkpoint, ds_checkpoint_dir(paths.checkpoint),
                         sharded_checkpoint_dir(paths.checkpoint)) if p.exists()]
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
    if is_sharded_dir(newest):
        meta, what = read_sharded_meta(newest, "--resume"), " (sharded directory)"
    elif newest.is_dir():
        meta, what = read_ds_meta(newest, "--resume"), " (DeepSpeed directory)"
    else:
        meta, what = read_checkpoint_file(newest, "--resume"), ""
    kind = KIND_NAMES.get(meta.get("kind"), "a")
    return (f"{newest}{what} already holds {kind} checkpoint at step {meta['step']} "
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
    #: checkpoint directories (DeepSpeed's, sharded) with their `latest` file's identity:
    #: a directory whose `latest` the new run never moved is the earlier run's
    directories: list[tuple[Path, tuple[int, int]]] = field(default_factory=list)

    @classmethod
    def of(cls, paths: OutputFiles) -> Leftovers:
        kept = cls()
        history = history_dir(paths.checkpoint)
        candidates = [paths.metrics, paths.loss_plot]
        if history.is_dir():
            candidates += [p for p in history.iterdir() if HISTORY_PATTERN.match(p.name)]
        if paths.samples.is_dir():
            candidates += sorted(paths.samples.glob("*.png"))
        for directory in (ds_checkpoint_dir(paths.checkpoint),
                          sharded_checkpoint_dir(paths.checkpoint)):
            if directory.is_dir():
                kept.directories.append((directory, _identity(directory / LATEST_FILE)))
                candidates += list(directory.iterdir())
        kept.files = [(p, _identity(p)) for p in candidates if p.exists()]
        return kept

    def discard(self, log: Log) -> None:
        """Remove what is still the earlier run's; the new run's first save is complete."""
        for directory, latest in self.directories:
            if _identity(directory / LATEST_FILE) == latest:
                shutil.rmtree(directory, ignore_errors=True)  # this run writes another kind
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


MODEL_FLAGS_FIX = "drop those flags to resume, or train a new model under another output name"


def check_flags_agree(given: dict[str, Any], saved: dict[str, Any], source: str,
                      kind: str = "model", fix: str = MODEL_FLAGS_FIX) -> None:
    """Flags given on the command line that contradict the checkpoint's config (`kind`:
    which config, for the message; `fix`: what to do).

    A field the config does not record was added after the checkpoint was written (e.g.
    --rotary_emb): that model has the option off, so only an "on" value contradicts it."""
    differ = sorted(k for k, v in given.items()
                    if (_norm(saved[k]) != _norm(v) if k in saved else v not in (None, False)))
    if differ:
        values = ", ".join(f"{k} {_show(given[k])} (checkpoint: "
                           f"{_show(saved[k]) if k in saved else 'not recorded: off'})"
                           for k in differ)
        raise ConfigError(f"{kind} flags contradict the checkpoint {source}: {values}", fix)


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
    partitions (load_ds_checkpoint). A sharded directory is left unread where the backend
    loads DCP shards (each rank then reads its own: restore_training), else read whole."""
    if start.source is None:
        return None
    source = start.source
    payload = backend.everywhere("the checkpoint load", lambda: load_checkpoint(
        source, start.flag, kind, keep_ds_dir=backend.has_native_checkpoint,
        keep_sharded=backend.saves_sharded))
    within = f", {payload['batch']} batches into the next" if payload.get("batch") else ""
    log.info(f"resuming {source} at step {payload['step']} (epoch {payload['epoch']}"
             f"{within})")
    payload["loaded_from"] = source
    return payload


def seek_in_epoch(state: LoopState, payload: dict[str, Any], backend: DistributedBackend,
                  batch_size: int, log: Log) -> None:
    """Where in its epoch a resumed run goes on, in this run's micro-batches per rank.

    The sample order is a function of the seed, the epoch and the global sample index
    alone (data/loader.py), so the position is the number of samples the epoch has
    trained on over all ranks: a resume on another number of ranks or --ga_steps (with the
    same global batch) sees the very batches the interrupted run would have. A checkpoint
    written before that count was kept is moved by its --batch_size instead."""
    micro = backend.rank_batch_size(batch_size) * backend.world_size  # global micro-batch
    if state.samples is not None:
        if state.samples % micro:
            log.info(f"warning: the checkpoint stopped {state.samples} samples into its "
                     f"epoch, not a whole number of this run's micro-batches of {micro}: "
                     f"the epoch goes on from sample {state.samples // micro * micro}")
        if state.samples // micro != state.batch:
            log.info(f"the epoch goes on from sample {state.samples} (micro-batch "
                     f"{state.samples // micro} of each rank: the split differs from the "
                     "checkpoint's)")
        state.batch = state.samples // micro
        return
    saved_batch = payload["configs"].get("train", {}).get("batch_size", batch_size)
    if state.batch and saved_batch != batch_size:
        state.batch = state.batch * saved_batch // batch_size
        log.info(f"warning: --batch_size {batch_size} differs from the "
                 f"checkpoint's {saved_batch}: the epoch goes on from batch {state.batch}")
    state.samples = state.batch * micro


def restore_training(payload: dict[str, Any], engine: Engine, backend: DistributedBackend,
                     batch_size: int, seed: int, log: Log) -> LoopState:
    """Optimizer, scheduler, RNG and data position of `payload`, put back on this rank.

    batch_size: this run's --batch_size (a different one moves the position inside the
    epoch); seed: --seed, for ranks the checkpoint has no RNG states of.
    Called last before the loop, so no setup step draws from the restored RNG.
    """
    why = engine.load_training_state(payload)
    loaded: set[str] = set()  # what a sharded save brought with its shards
    if "ds_dir" in payload:
        load_ds_checkpoint(engine, payload, backend, log)
    if "sharded_dir" in payload:
        with backend.waiting("the sharded checkpoint load"):
            loaded = load_into_engine(engine, payload["sharded_dir"])
        why = None if "optim" in loaded or payload.get("step", 0) == 0 else (
            "the checkpoint holds none")
    if why:
        log.info(f"warning: the optimizer starts fresh ({why})")
    restore_ema(payload, engine, log, sharded_ema="ema" in loaded)
    state = LoopState.from_checkpoint(payload)
    seek_in_epoch(state, payload, backend, batch_size, log)
    exact = restore_rank_rng(payload["rng"], backend.rank, backend.world_size,
                             seed + state.step, backend.device)
    if not exact and not payload["rng"]:
        log.info(f"the checkpoint carries no random states (backend {payload['backend']}): "
                 "seeded from --seed")
    elif not exact:
        log.info(f"warning: the checkpoint was saved by {payload['world_size']} rank(s), this "
                 f"run has {backend.world_size}: random states reseeded (the run continues, "
                 "but no longer repeats an uninterrupted one exactly)")
    return state


def restore_ema(payload: dict[str, Any], engine: Engine, log: Log,
                sharded_ema: bool = False) -> None:
    """The checkpoint's EMA into the engine's (--ema_decay), from whichever form it holds
    it in: a sharded save's `ema` entries (sharded_ema: loaded with its shards), a
    DeepSpeed tag's `ema/` shards, or a single file's whole `ema_weights`. A checkpoint
    without one leaves the EMA the resumed weights; a run without --ema_decay drops the
    checkpoint's, and says so."""
    saved = (payload.get("configs") or {}).get("ema")
    ema = engine.ema
    if ema is None:
        if saved:
            log.info(f"warning: the checkpoint keeps EMA weights (--ema_decay "
                     f"{saved['ema_decay']:g}) and this run has no --ema_decay: its saves "
                     "will hold none; add the flag to keep them")
        return
    if "sharded_dir" in payload:
        found = sharded_ema
    elif "ds_dir" in payload:
        folder = Path(payload["ds_dir"]) / payload["ds_tag"] / EMA_FOLDER
        found = folder.is_dir()
        if found:
            load_ema_shards(engine, folder)
    else:
        weights = payload.get("ema_weights")
        found = bool(weights)
        if found:
            missing = ema.load_full_state(weights)
            if missing:
                raise CheckpointError(f"the checkpoint's EMA weights lack {len(missing)} of "
                                      f"the model's parameters ({', '.join(missing[:3])})",
                                      "resume with the model flags it was saved with")
    if not found:
        log.info("the checkpoint holds no EMA weights: the average starts from its weights")
        return
    now = {"ema_decay": ema.settings.decay, "ema_start_step": ema.settings.start_step,
           "ema_every": ema.settings.every}
    changed = [f"{k} {now[k]:g} (checkpoint: {saved.get(k)})" for k in now
               if saved and saved.get(k) is not None and saved.get(k) != now[k]]
    if changed:
        log.info(f"EMA settings changed on resume: {', '.join(changed)}; the saved average "
                 "goes on under the new ones")
