"""NAME-loss.png: redrawn at each save from the metrics file, one curve per logged loss.

Pillow draws without anti-aliasing, so a curve's pixels are exactly its colour and can be
counted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from dalle_dist.train.loss_plot import CURVES, LR_CURVE
from dalle_dist.train.run_log import RunLog

COLOURS = {key: colour for key, _, colour in (*CURVES, LR_CURVE)}


def pixels_of(path: Path, colour: tuple[int, int, int]) -> int:
    image = np.asarray(Image.open(path).convert("RGB"))
    return int((image == np.array(colour)).all(axis=-1).sum())


def test_plot_is_redrawn_at_each_save(tmp_path: Path) -> None:
    """Broken once: saved() drawing only when the PNG was missing: the second save left
    the first drawing in place."""
    plot = tmp_path / "dalle-loss.png"
    log = RunLog(tmp_path / "dalle.metrics.jsonl", loss_plot=plot)
    log.saved(0)
    assert not plot.exists(), "nothing logged yet: no plot"
    for step in (1, 2, 3):
        log.metrics({"step": step, "loss": 4.0 - step * 0.5})
    log.saved(3)
    first = plot.read_bytes()
    for step in (4, 5):
        log.metrics({"step": step, "loss": 2.0 - step * 0.1})
    log.saved(5)
    assert plot.read_bytes() != first
    assert pixels_of(plot, COLOURS["loss"]) > 100
    assert pixels_of(plot, COLOURS["val_loss"]) == 0, "no val_loss logged: one curve"


def test_validation_records_draw_a_second_curve(tmp_path: Path) -> None:
    """val_loss records (written on their own lines, as validation does) make a second
    curve in the validation colour. Broken once: read_curves taking only records with a
    "loss" key: the val_loss lines were skipped and the red curve was missing."""
    plot = tmp_path / "dalle-loss.png"
    log = RunLog(tmp_path / "dalle.metrics.jsonl", loss_plot=plot)
    for step in range(1, 11):
        log.metrics({"step": step, "epoch": 0, "loss": 5.0 / step})
        if step % 5 == 0:
            log.metrics({"step": step, "val_loss": 6.0 / step})
    log.saved(10)
    assert pixels_of(plot, COLOURS["loss"]) > 100
    assert pixels_of(plot, COLOURS["val_loss"]) > 100


def test_silent_ranks_draw_nothing(tmp_path: Path) -> None:
    plot = tmp_path / "dalle-loss.png"
    log = RunLog(tmp_path / "dalle.metrics.jsonl", enabled=False, loss_plot=plot)
    log.metrics({"step": 1, "loss": 1.0})
    log.saved(1)
    assert not plot.exists()


def test_a_changing_learning_rate_draws_its_own_curve(tmp_path: Path) -> None:
    """--warmup_steps / --lr_schedule: the logged rate is drawn on its own scale; a
    constant one is not drawn. Bugs caught: the rate left off the plot, or drawn on the
    loss scale (1e-3 against losses of 1-5: a flat line on the bottom edge)."""
    plot = tmp_path / "dalle-loss.png"
    log = RunLog(tmp_path / "dalle.metrics.jsonl", loss_plot=plot)
    for step in range(1, 21):
        log.metrics({"step": step, "loss": 5.0 / step, "lr": 1e-3})
    log.saved(20)
    assert pixels_of(plot, COLOURS["lr"]) == 0, "a constant rate: no curve"
    for step in range(21, 41):
        log.metrics({"step": step, "loss": 5.0 / step, "lr": 1e-3 * (41 - step) / 20})
    log.saved(40)
    image = np.asarray(Image.open(plot).convert("RGB"))
    rows = np.nonzero((image == np.array(COLOURS["lr"])).all(axis=-1))[0]
    rows = rows[rows > 24]  # not the legend's swatch
    assert len(rows) > 100
    # from the top of the chart (the largest rate) down to its bottom (the smallest)
    assert rows.max() - rows.min() > 0.8 * (image.shape[0] - 28 - 36 - 20), rows
