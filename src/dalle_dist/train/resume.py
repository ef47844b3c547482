"""Which checkpoint a run continues from, and whether the flags agree with it.

`--resume auto` takes the newest complete checkpoint beside the output name: the
single file `<name>.pt` (always complete: it is replaced by rename), earlier ones kept by
--keep_n_checkpoints, and the DeepSpeed directory `<name>-ds-cp/` (complete up to the tag
`latest` names). The DeepSpeed directory wins a tie: it holds fp32 master weights and the
optimizer state, which the single file of a DeepSpeed run lacks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dalle_dist.checkpoint_io import HISTORY_PATTERN, history_dir, read_checkpoint_file
from dalle_dist.ds_checkpoint import ds_checkpoint_dir, is_ds_checkpoint_dir, read_ds_meta
from dalle_dist.errors import CheckpointError, ConfigError
from dalle_dist.train.config import RunPaths
from dalle_dist.train.run_log import RunLog


def _position(meta: dict[str, Any]) -> tuple[int, int, int]:
    return meta["step"], meta["epoch"], meta.get("batch", 0)


def newest_checkpoint(paths: RunPaths, log: RunLog) -> Path | None:
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
            found.append((_position(read_checkpoint_file(file, "--resume", mmap=True)), 0, file))
        except CheckpointError as exc:
            log.info(f"warning: skipping {file}: {exc}")
        else:
            if file == paths.checkpoint:
                break  # always the newest file: the kept ones are its earlier versions
    return max(found)[2] if found else None


def is_own_checkpoint(source: Path, paths: RunPaths) -> bool:
    """True when `source` is this run's newest output (no need to save it again first)."""
    own = {paths.checkpoint.resolve(), ds_checkpoint_dir(paths.checkpoint).resolve()}
    return source.resolve() in own


def check_flags_agree(given: dict[str, Any], saved: dict[str, Any], source: str) -> None:
    """Flags given on the command line that contradict the checkpoint's config."""
    differ = sorted(k for k, v in given.items() if k in saved and _norm(saved[k]) != _norm(v))
    if differ:
        values = ", ".join(f"{k} {_show(given[k])} (checkpoint: {_show(saved[k])})"
                           for k in differ)
        raise ConfigError(f"model flags contradict the checkpoint {source}: {values}",
                          "drop those flags to resume, or train a new model under another "
                          "output name")


def _norm(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _show(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
