"""Experiment trackers: Weights & Biases and TensorBoard, fed by the root rank's RunLog.

RunLog (train/run_log.py) hands each tracker what it already holds on the host: the run's
configs once, every metrics record it writes to NAME.metrics.jsonl, and every sample grid
PNG the loop wrote. Trackers therefore add no device synchronisation to a step, and the
loop does not know they exist. Both packages are optional extras, imported here only
when their flag is given (`import dalle_dist` never imports them).

W&B never makes a run wait on the network: without an API key it logs offline at once;
with one, the API host must answer a TCP connect within a few seconds, or the run logs
offline; online, `wandb.init` and the upload at the end are bounded (INIT_TIMEOUT_S,
FINISH_TIMEOUT_S). An offline run prints one line naming the `wandb sync` command.
"""

from __future__ import annotations

import json
import netrc
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from dalle_dist.train.config import TrackerConfig

#: seconds wandb.init may take online before the run falls back to offline logging
INIT_TIMEOUT_S = 30.0
#: seconds the end of an online run waits for its upload (what is left is on disk: wandb sync)
FINISH_TIMEOUT_S = 60.0
#: seconds to wait for the W&B API host to accept a TCP connection
PROBE_TIMEOUT_S = 3.0
DEFAULT_WANDB_URL = "https://api.wandb.ai"

Say = Callable[[str], None]


class Tracker(Protocol):
    """What RunLog calls on each tracker, on the root rank only."""

    name: str

    def log_config(self, config: dict[str, Any]) -> None: ...

    def log_metrics(self, record: dict[str, Any]) -> None: ...

    def log_image(self, name: str, path: Path, step: int) -> None: ...

    def finish(self, failed: bool = False) -> None: ...


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics record, without its step (the tracker's x axis)."""
    return {k: v for k, v in record.items() if k != "step"
            and isinstance(v, int | float) and not isinstance(v, bool)}


def has_wandb_key(base_url: str) -> bool:
    """An API key in WANDB_API_KEY or in the netrc entry for the W&B host (where `wandb
    login` writes it); read without asking the network."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(base_url).hostname or ""
    path = os.environ.get("NETRC") or str(Path.home() / ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def reachable(base_url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the W&B API host accepts a TCP connection within `timeout` seconds."""
    parsed = urlparse(base_url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def wandb_mode() -> tuple[str | None, str]:
    """(mode for wandb.init, why offline). WANDB_MODE, when set, is the user's: None lets
    wandb read it."""
    if os.environ.get("WANDB_MODE"):
        return None, f"WANDB_MODE={os.environ['WANDB_MODE']}"
    base_url = os.environ.get("WANDB_BASE_URL", DEFAULT_WANDB_URL)
    if not has_wandb_key(base_url):
        return "offline", "no W&B API key (WANDB_API_KEY or `wandb login`)"
    if not reachable(base_url):
        return "offline", f"{urlparse(base_url).hostname} did not answer"
    return "online", ""


class WandbTracker:
    """One W&B run: the configs, a history row per metrics record at its step, the sample
    grids as images."""

    name = "wandb"

    def __init__(self, config: TrackerConfig, run_name: str, directory: Path,
                 say: Say) -> None:
        import wandb

        self._wandb = wandb
        mode, why = wandb_mode()
        directory.mkdir(parents=True, exist_ok=True)

        def start(mode: str | None) -> Any:
            settings = wandb.Settings(init_timeout=INIT_TIMEOUT_S,
                                      finish_timeout=FINISH_TIMEOUT_S, console="off",
                                      silent=True)
            return wandb.init(project=config.wandb_project, entity=config.wandb_entity,
                              name=run_name, dir=str(directory), mode=mode,
                              settings=settings, reinit="create_new")

        try:
            self.run = start(mode)
        except Exception as error:  # online start failed (key refused, timeout): log offline
            if mode == "offline":
                raise
            why = f"W&B did not start online: {str(error).splitlines()[0][:200]}"
            self.run = start("offline")
        if self.run.offline:
            sync_dir = Path(self.run.settings.sync_dir)
            say(f"W&B is offline ({why}): run stored in {sync_dir}; upload it later with: "
                f"wandb sync {sync_dir}")
        else:
            say(f"W&B run: {self.run.url}")

    def log_config(self, config: dict[str, Any]) -> None:
        self.run.config.update(config, allow_val_change=True)

    def log_metrics(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        self.run.log(scalars(record), step=int(step) if step is not None else None)

    def log_image(self, name: str, path: Path, step: int) -> None:
        self.run.log({name: self._wandb.Image(str(path), caption=path.name)}, step=step)

    def finish(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class TensorBoardTracker:
    """TensorBoard event files in one folder: a scalar per metric, the sample grids as
    images, the configs as text."""

    name = "tensorboard"

    def __init__(self, directory: Path, say: Say) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(directory), flush_secs=30)
        say(f"TensorBoard event files in {directory} (tensorboard --logdir {directory})")

    def log_config(self, config: dict[str, Any]) -> None:
        text = json.dumps(config, indent=2, default=str)
        self.writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)

    def log_metrics(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, step)

    def log_image(self, name: str, path: Path, step: int) -> None:
        import numpy as np
        from PIL import Image

        with Image.open(path) as image:
            pixels = np.asarray(image.convert("RGB"))
        self.writer.add_image(name, pixels, step, dataformats="HWC")

    def finish(self, failed: bool = False) -> None:
        self.writer.close()


def open_trackers(config: TrackerConfig, run_name: str, output_dir: Path,
                  say: Say) -> list[Tracker]:
    """The trackers the flags ask for (call on the root rank only). W&B keeps its run
    folder in WANDB_DIR when set, else beside the checkpoint (`output_dir/wandb/`)."""
    trackers: list[Tracker] = []
    if config.wandb:
        directory = Path(os.environ.get("WANDB_DIR") or output_dir)
        trackers.append(WandbTracker(config, run_name, directory, say))
    if config.tensorboard_dir is not None:
        trackers.append(TensorBoardTracker(Path(config.tensorboard_dir), say))
    return trackers
