"""`python -m tests.backends.memory_probe ARGS` runs `python -m dalle_dist ARGS` and writes
$MEMORY_PROBE_DIR/rank<R>.json at exit: this rank's peak resident set (VmHWM) in each
phase of the run, in MB, the seconds spent in each, and its resident set just before a
DALL-E is first constructed (torch imported, the process group up; no DALL-E weight yet).

Phases follow the run's own calls; each starts by resetting the peak to what is resident
then (/proc/self/clear_refs), so a phase's figure is the most this process held during
it, everything live before it included:

- "start-up": process start to the first step (build, shard, data), less a resume's load;
- "resume": `restore_training` (a sharded checkpoint's load, optimizer included);
- "step 1": the first optimizer step (forward, backward, Adam's state allocated);
- "save": every checkpoint save (the largest);
- "sample grid": every sample grid (the largest);
- "other": whatever runs between those (logging, later steps, the end).

Rank 0 also writes grid-input.pt: the CPU RNG state and the batch its first sample grid
started from, so a test can draw the same grid from the saved weights in one process.
Nothing else changes. tests/backends/test_sharded_memory.py launches it.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def status_mb(field: str) -> float:
    for line in STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


class Phases:
    def __init__(self, folder: Path, rank: int) -> None:
        self.folder, self.rank = folder, rank
        self.current = "start-up"
        self.peaks: dict[str, float] = {}
        self.seconds: dict[str, float] = {}
        self.since = time.monotonic()
        self.before_model_mb: float | None = None

    def switch(self, phase: str) -> None:
        """Close the current phase at its peak, and start `phase` from what is resident."""
        peak = status_mb("VmHWM")
        self.peaks[self.current] = max(self.peaks.get(self.current, 0.0), peak)
        now = time.monotonic()
        self.seconds[self.current] = self.seconds.get(self.current, 0.0) + now - self.since
        self.since = now
        CLEAR_REFS.write_text("5")
        self.current = phase

    def around(self, phase: str, function: Callable[..., Any],
               first_only: bool = False) -> Callable[..., Any]:
        calls = {"n": 0}

        @functools.wraps(function)
        def measured(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if first_only and calls["n"] > 1:
                return function(*args, **kwargs)
            self.switch(phase)
            try:
                return function(*args, **kwargs)
            finally:
                self.switch("other")
        return measured

    def write(self) -> None:
        self.switch("other")
        (self.folder / f"rank{self.rank}.json").write_text(json.dumps(
            {"peaks_mb": self.peaks, "seconds": self.seconds,
             "before_model_mb": self.before_model_mb}))


def install(folder: Path, rank: int) -> None:
    import torch

    import dalle_dist.cli
    from dalle_dist.checkpoint.checkpointer import Checkpointer
    from dalle_dist.model.dalle import DALLE
    from dalle_dist.train import commands, loop

    phases = Phases(folder, rank)
    build = DALLE.__init__

    @functools.wraps(build)
    def build_measured(self: Any, *args: Any, **kwargs: Any) -> None:
        if phases.before_model_mb is None:
            phases.before_model_mb = status_mb("VmRSS")
        build(self, *args, **kwargs)

    write_samples = loop.write_samples

    @functools.wraps(write_samples)
    def write_samples_recorded(task: Any, engine: Any, backend: Any, batch: Any,
                               *args: Any, **kwargs: Any) -> Any:
        grid_input = folder / "grid-input.pt"
        if backend.is_root and not grid_input.exists():
            images, text, _ = batch
            torch.save({"rng": torch.get_rng_state(), "images": images, "text": text},
                       grid_input)
        return write_samples(task, engine, backend, batch, *args, **kwargs)

    DALLE.__init__ = build_measured  # type: ignore[method-assign]
    commands.restore_training = phases.around("resume", commands.restore_training)
    loop.optimizer_step = phases.around("step 1", loop.optimizer_step, first_only=True)
    loop.write_samples = phases.around("sample grid", write_samples_recorded)
    Checkpointer.save = phases.around("save", Checkpointer.save)  # type: ignore[method-assign]
    exit_now = dalle_dist.cli.exit_now  # a rank of a launch ends with os._exit

    def write_and_exit(status: int) -> Any:
        phases.write()
        return exit_now(status)

    dalle_dist.cli.exit_now = write_and_exit
    atexit.register(phases.write)  # one process ends normally


def main() -> int:
    install(Path(os.environ["MEMORY_PROBE_DIR"]), int(os.environ.get("RANK", "0")))
    from dalle_dist.cli import main as dalle_main

    return dalle_main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
