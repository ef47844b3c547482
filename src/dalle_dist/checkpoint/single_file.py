"""The single-file layout: `NAME.pt`, and earlier saves kept in `NAME-checkpoints/`.

`NAME.pt` is always complete (it is replaced by rename); --keep_n_checkpoints keeps the
newest N saves as `NAME-checkpoints/step-NNNNNNN.pt` beside it.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from dalle_dist.backends import Engine
from dalle_dist.checkpoint.format import write_checkpoint_file
from dalle_dist.fileio import atomic_writer

HISTORY_PATTERN = re.compile(r"step-(\d+)\.pt$")


def history_dir(path: str | Path) -> Path:
    """`dalle.pt` -> `dalle-checkpoints/`, where --keep_n_checkpoints keeps earlier saves."""
    path = Path(path)
    return path.with_name(f"{path.stem}-checkpoints")


def keep_history(path: str | Path, step: int, keep_n: int) -> Path:
    """Keep the file just written at `path` as history/step-N.pt; drop all but the newest N.

    A hard link costs no copy (`path` is replaced by rename at the next save, so the link
    keeps this version); where links are not supported the file is copied atomically.
    """
    path, folder = Path(path), history_dir(path)
    folder.mkdir(exist_ok=True)
    kept = folder / f"step-{step:07d}.pt"
    kept.unlink(missing_ok=True)
    try:
        os.link(path, kept)
    except OSError:
        with atomic_writer(kept) as out, open(path, "rb") as src:
            shutil.copyfileobj(src, out)
    saved = sorted((p for p in folder.iterdir() if HISTORY_PATTERN.match(p.name)),
                   key=lambda p: int(HISTORY_PATTERN.match(p.name).group(1)), reverse=True)
    for old in saved[keep_n:]:
        old.unlink(missing_ok=True)
    return kept


def ema_payload(engine: Engine) -> dict[str, Any]:
    """{"ema_weights": the whole EMA, fp32} on the root when the engine keeps one; {}
    elsewhere. Collective when the EMA is sharded (every rank calls it)."""
    if engine.ema is None:
        return {}
    weights = engine.ema.full_state(engine.is_root)
    return {"ema_weights": weights} if weights is not None else {}


def save_single_file(engine: Engine, path: Path, meta: dict[str, Any],
                     keep_n: int | None) -> None:
    """Write meta + weights + optimizer + the engine's training state as one file, from
    the root rank; keep_n: also keep it among the newest N in `<name>-checkpoints/`.

    Every rank calls it (gathering a sharded model is collective); only the root writes.
    """
    weights, optimizer = engine.full_state_dict(), engine.optimizer_state_dict()
    ema = ema_payload(engine)
    if engine.is_root:
        state = engine.training_state()
        with engine.working_alone():
            write_checkpoint_file(path, {**meta, "weights": weights, "optimizer": optimizer,
                                         **state, **ema})
            if keep_n:
                keep_history(path, meta["step"], keep_n)
