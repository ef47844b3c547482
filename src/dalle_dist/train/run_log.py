"""What a run tells its user: log lines, a progress bar, metrics as JSON lines, the loss
plot, and the experiment trackers (W&B, TensorBoard) fed with the same records.

Only the root rank writes; the other ranks get a RunLog that stays silent. Everything a
tracker sees is already on the host (a metrics record, a PNG the loop wrote), so trackers
add no device synchronisation to a step.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from dalle_dist.train.loss_plot import draw_loss_plot
from dalle_dist.train.trackers import Tracker


class RunLog:
    def __init__(self, metrics_path: Path | None, enabled: bool = True,
                 loss_plot: Path | None = None) -> None:
        """loss_plot: where `saved` redraws the loss curves from the metrics file (None:
        no plot)."""
        self.enabled = enabled
        self.metrics_path = metrics_path if enabled else None
        self.loss_plot = loss_plot if enabled else None
        self.bar: tqdm | None = None
        self.started = time.time()
        self.trackers: list[Tracker] = []

    def attach(self, trackers: Sequence[Tracker], config: dict[str, Any]) -> None:
        """Feed `trackers` from now on (root only), starting with the run's `config`."""
        if not self.enabled:
            return
        self.trackers = list(trackers)
        self._to_trackers("config", lambda t: t.log_config(config))

    def info(self, message: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.clear()
        print(message, flush=True)
        if self.bar is not None:
            self.bar.refresh()

    def start_progress(self, total: int, initial: int, desc: str) -> None:
        # In a log file a redrawn bar is a line per update: redraw rarely there.
        interactive = sys.stderr.isatty()
        self.bar = tqdm(total=total, initial=initial, desc=desc, disable=not self.enabled,
                        unit="step", file=sys.stderr, dynamic_ncols=True,
                        mininterval=0.5 if interactive else 30.0)

    def progress(self, **postfix: float) -> None:
        if self.bar is not None:
            self.bar.update()
            if postfix:
                self.bar.set_postfix({k: f"{v:.4g}" for k, v in postfix.items()}, refresh=False)

    def end_progress(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def metrics(self, record: dict[str, Any]) -> None:
        """Append one JSON line; opened per record so a crash loses at most that line."""
        if self.metrics_path is None:
            return
        record = {"time": round(time.time() - self.started, 3), **record}
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        self._to_trackers("metrics", lambda t: t.log_metrics(record))

    def image(self, name: str, path: Path, step: int) -> None:
        """A PNG the run wrote (a sample grid), for the trackers."""
        if self.enabled:
            self._to_trackers("image", lambda t: t.log_image(name, path, step))

    def saved(self, step: int) -> None:
        """After each checkpoint save: redraw the loss plot from the metrics file."""
        if self.loss_plot is not None and self.metrics_path is not None:
            draw_loss_plot(self.metrics_path, self.loss_plot)

    def close(self, failed: bool = False) -> None:
        """End every tracker's run (failed: the run ended with an error)."""
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            try:
                tracker.finish(failed)
            except Exception as error:  # the run's own files are complete: only warn
                self.info(f"warning: {tracker.name} did not finish cleanly: {error}")

    def _to_trackers(self, what: str, call: Callable[[Tracker], None]) -> None:
        """A tracker that fails (a full disk, a broken upload) is dropped with one warning:
        the metrics file and the checkpoints are the run's record, not the tracker."""
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as error:
                self.trackers.remove(tracker)
                self.info(f"warning: {tracker.name} stopped logging ({what}: {error}); the "
                          "metrics file has every record")
