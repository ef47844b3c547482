"""What a run tells its user: log lines, a progress bar, and metrics as JSON lines.

Only the root rank writes; the other ranks get a RunLog that stays silent.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm


class RunLog:
    def __init__(self, metrics_path: Path | None, enabled: bool = True) -> None:
        self.enabled = enabled
        self.metrics_path = metrics_path if enabled else None
        self.bar: tqdm | None = None
        self.started = time.time()

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
