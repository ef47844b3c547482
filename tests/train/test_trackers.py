"""W&B, TensorBoard and the loss plot hold what the metrics file holds.

One `train` run with both trackers (W&B offline: the test's HOME has no API key) is read
back with the packages' own formats: the offline run file through wandb's record schema
(tests/train/wandb_records.py) and the event files through TensorBoard's
EventAccumulator. Every logged number must equal the metrics file's at its step, and
the sample grids must be there at their steps.

What would fail: a metric left out of a tracker or logged at the wrong step, a tracker fed
before the record is complete, sample grids not passed on, W&B left waiting for a
network or an account, the loss plot not redrawn at the last save.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import TINY_DALLE_FLAGS, assert_user_error, run_cli
from tests.train.wandb_records import read_run

STEPS = 4  # 64 shapes at batch 16


def metric_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory: pytest.TempPathFactory, tiny_vae: Path) -> dict:
    folder = tmp_path_factory.mktemp("tracked")
    home = folder / "home"  # no ~/.netrc: no W&B key, so W&B must log offline at once
    home.mkdir()
    # No W&B variables of the developer's (a key would take the run online).
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(home), NETRC=str(home / ".netrc"))
    result = subprocess.run([sys.executable, "-m", "dalle_dist",
        "train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS, "--epochs", "1",
        "--batch_size", "16", "--shapes_count", str(STEPS * 16), "--fidelity_images", "0",
        "--log_every_n_steps", "1", "--sample_every_n_steps", "2", "--save_every_n_steps", "3",
        "--wandb_name", "dalle_dist_test", "--tensorboard_dir", str(folder / "tb"),
        "--dalle_output_file_name", str(folder / "dalle")],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return {"folder": folder, "stdout": result.stdout,
            "metrics": metric_records(folder / "dalle.metrics.jsonl")}


def test_wandb_offline_run_holds_the_metrics_and_samples(tracked_run: dict) -> None:
    """Broken once: log_metrics passing step=None (W&B's own counter): the history rows
    fell on steps 0..n-1, and the row of step 1 held step 2's numbers."""
    lines = [line for line in tracked_run["stdout"].splitlines() if "wandb sync" in line]
    assert len(lines) == 1, tracked_run["stdout"]
    sync_dir = Path(re.search(r"wandb sync (\S+)$", lines[0]).group(1))
    assert sync_dir.is_dir() and sync_dir.parent == tracked_run["folder"] / "wandb"
    config, history = read_run(next(sync_dir.glob("run-*.wandb")))
    assert config["model"]["dim"] == 32, config.keys()
    assert config["run"]["backend"] == "single"
    metrics = tracked_run["metrics"]
    assert [r["step"] for r in metrics] == list(range(1, STEPS + 1))
    for record in metrics:
        row = history[record["step"]]
        for key, value in record.items():
            if key != "step":
                assert row[key] == pytest.approx(value, rel=1e-12), (record["step"], key)
    for step in (2, 4):
        image = history[step]["samples/path"]
        assert (sync_dir / "files" / image).is_file(), image
        png = Image.open(tracked_run["folder"] / "dalle-samples" / f"step-{step:07d}.png")
        assert (history[step]["samples/width"], history[step]["samples/height"]) == png.size
    assert "samples/path" not in history[1] and "samples/path" not in history[3]


def test_tensorboard_events_hold_the_metrics_and_samples(tracked_run: dict) -> None:
    """Broken once: log_metrics skipping "grad_norm" (only loss-like keys): its tag was
    missing here."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tracked_run["folder"] / "tb"),
                              size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    metrics = tracked_run["metrics"]
    keys = {k for record in metrics for k in record if k != "step"}
    assert {"loss", "grad_norm", "lr", "samples_per_s", "time"} <= keys
    assert keys == set(events.Tags()["scalars"])
    for key in keys:
        logged = {e.step: e.value for e in events.Scalars(key)}
        expected = {r["step"]: r[key] for r in metrics if key in r}
        assert logged.keys() == expected.keys(), key
        for step, value in expected.items():  # TensorBoard stores float32
            assert logged[step] == np.float32(value), (key, step)
    images = events.Images("samples")
    assert [e.step for e in images] == [2, 4]
    png = Image.open(tracked_run["folder"] / "dalle-samples" / "step-0000004.png")
    assert (images[-1].width, images[-1].height) == png.size


def test_loss_plot_is_drawn_from_the_final_metrics(tracked_run: dict, tmp_path: Path) -> None:
    """The run's NAME-loss.png equals a fresh drawing of its whole metrics file: it was
    redrawn at the last save. Broken once: Checkpointer not calling on_save after the
    epoch-end save: the plot stopped at step 3's save."""
    from dalle_dist.train.loss_plot import draw_loss_plot

    folder = tracked_run["folder"]
    plot = folder / "dalle-loss.png"
    assert plot.is_file()
    assert draw_loss_plot(folder / "dalle.metrics.jsonl", tmp_path / "fresh.png")
    assert plot.read_bytes() == (tmp_path / "fresh.png").read_bytes()


def test_bad_tracker_flags(tmp_path: Path, tiny_vae: Path) -> None:
    """One line, exit 2, nothing written, before any training, naming the flag. Broken
    once: TrackerConfig.validate() not called: SummaryWriter's own "File exists" came
    out (as the tracker-start error) instead of the flag's message."""
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    out = tmp_path / "out" / "dalle"
    common = ["train", "--vae_path", str(tiny_vae), "--dalle_output_file_name", str(out)]
    assert_user_error(run_cli(*common, "--tensorboard_dir", str(not_a_dir)),
                      "--tensorboard_dir", "is a file")
    assert not (tmp_path / "out").exists()
    from dalle_dist.errors import ConfigError
    from dalle_dist.train.config import TrackerConfig

    with pytest.raises(ConfigError, match="--wandb_name is empty"):  # same path, in-process
        TrackerConfig(wandb_name=" ").validate()


def test_missing_package_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The package query is the one thing faked: wandb is installed here."""
    import importlib.util

    from dalle_dist.errors import ConfigError
    from dalle_dist.train.config import TrackerConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("wandb", "tensorboard")
                        else real(name, *a))
    with pytest.raises(ConfigError, match=r"dalle_dist\[wandb\]"):
        TrackerConfig(wandb_entity="team").validate()
    with pytest.raises(ConfigError, match=r"dalle_dist\[tensorboard\]"):
        TrackerConfig(tensorboard_dir="tb").validate()


def test_wandb_goes_offline_without_key_or_network(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    """The mode is decided before wandb.init, without waiting: no key -> offline; a key
    but a host that refuses the connection -> offline; a host that answers -> online.
    Broken once: reachable() returning True without connecting: the refused host was
    taken as online (and wandb.init would have waited up to INIT_TIMEOUT_S)."""
    import socket

    from dalle_dist.train.trackers import wandb_mode

    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    assert wandb_mode()[0] == "offline"
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
        (tmp_path / "netrc").write_text("machine 127.0.0.1 login user password KEY\n")
        monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
        assert wandb_mode() == ("online", "")
    # the port is closed now: refused at once
    mode, why = wandb_mode()
    assert mode == "offline" and "did not answer" in why
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode()[0] is None, "WANDB_MODE is the user's: wandb reads it"
