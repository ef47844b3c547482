"""NAME-loss.png: the training loss and, when logged, the validation loss over steps, and
the learning rate on a scale of its own (right) when it changes (warmup, decay). When
image-quality metrics are logged (train --eval_every_n_steps), a panel below draws each
over the same steps, scaled to its own range, its legend giving its first and last value.

Drawn from NAME.metrics.jsonl with Pillow, which the package needs anyway: one chart does
not justify matplotlib as a dependency (with its font, contour and layout packages), and
Pillow draws without anti-aliasing, so each curve is exactly its colour (the tests count
its pixels). A step logged twice (a run resumed from an earlier checkpoint repeats the
steps after it) keeps its newest value.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from PIL import Image, ImageDraw

WIDTH, HEIGHT = 640, 400
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 64, 28, 36
BACKGROUND, AXES, GRID = (255, 255, 255), (0, 0, 0), (225, 225, 225)
#: the curves: (metrics key, legend label, colour)
CURVES = (("loss", "training loss", (31, 119, 180)),
          ("val_loss", "validation loss", (214, 39, 40)))
#: the learning rate, from 0 (bottom) to its largest value (top), labelled on the right
LR_CURVE = ("lr", "learning rate (right)", (44, 160, 44))
#: the image-quality panel's curves (train/quality.py), each from its own min to its max
QUALITY_CURVES = (("fid", "FID", (148, 103, 189)),
                  ("clip_score", "CLIP score", (255, 127, 14)),
                  ("caption_fidelity", "caption fidelity", (23, 190, 207)))
PANEL_HEIGHT = 200


def read_curves(metrics: Path) -> dict[str, list[tuple[int, float]]]:
    """(step, value) pairs of each curve's key, by step; unreadable lines are skipped (a
    crash can leave the last one cut)."""
    by_key: dict[str, dict[int, float]] = {
        key: {} for key, _, _ in (*CURVES, LR_CURVE, *QUALITY_CURVES)}
    if not metrics.exists():
        return {key: [] for key in by_key}
    for line in metrics.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        step = record.get("step")
        if not isinstance(step, int):
            continue
        for key in by_key:
            value = record.get(key)
            if isinstance(value, int | float) and math.isfinite(value):
                by_key[key][step] = float(value)
    return {key: sorted(points.items()) for key, points in by_key.items()}


def _label(value: float) -> str:
    return f"{value:.4g}"


def draw_loss_plot(metrics: Path, out: Path) -> bool:
    """Redraw `out` from `metrics`; False (nothing written) while neither a loss nor an
    image-quality metric is logged yet. Written to a temporary file and renamed, so a
    viewer never sees half a PNG."""
    curves = read_curves(metrics)
    rates = curves.pop(LR_CURVE[0])
    quality = {key: curves.pop(key) for key, _, _ in QUALITY_CURVES}
    points = [p for values in curves.values() for p in values]
    measured = [p for values in quality.values() for p in values]
    if not (curves["loss"] or measured):
        return False
    steps = [s for s, _ in points + measured]
    values = [v for _, v in points] or [0.0, 1.0]  # (only quality logged: an empty chart)
    x0, x1 = min(steps), max(steps)
    y0, y1 = min(values), max(values)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    pad = (y1 - y0) * 0.05
    y0, y1 = y0 - pad, y1 + pad
    left, right = MARGIN_LEFT, WIDTH - MARGIN_RIGHT
    top, bottom = MARGIN_TOP, HEIGHT - MARGIN_BOTTOM

    def xy(step: int, value: float) -> tuple[float, float]:
        return (left + (step - x0) / (x1 - x0) * (right - left),
                bottom - (value - y0) / (y1 - y0) * (bottom - top))

    panel = any(quality.values())
    image = Image.new("RGB", (WIDTH, HEIGHT + (PANEL_HEIGHT if panel else 0)), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for i in range(5):  # horizontal grid lines with their values
        value = y0 + (y1 - y0) * i / 4
        y = xy(x0, value)[1]
        draw.line([(left, y), (right, y)], fill=GRID)
        draw.text((4, y - 6), _label(value), fill=AXES)
    draw.rectangle([left, top, right, bottom], outline=AXES)
    draw.text((left, bottom + 6), f"step {x0}", fill=AXES)
    last = f"step {x1}"
    draw.text((right - draw.textlength(last), bottom + 6), last, fill=AXES)
    legend_x = left
    for key, label, colour in CURVES:
        values_of = curves[key]
        if not values_of:
            continue
        line = [xy(s, v) for s, v in values_of]
        if len(line) == 1:
            x, y = line[0]
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
        else:
            draw.line(line, fill=colour, width=2)
        draw.rectangle([legend_x, 8, legend_x + 14, 18], fill=colour)
        draw.text((legend_x + 20, 7), label, fill=AXES)
        legend_x += 40 + int(draw.textlength(label))
    if len({v for _, v in rates}) > 1:  # a constant rate says nothing on a chart
        top_rate = max(v for _, v in rates)
        line = [(xy(step, y0)[0], bottom - v / top_rate * (bottom - top)) for step, v in rates
                if x0 <= step <= x1]
        colour = LR_CURVE[2]
        draw.line(line, fill=colour, width=2)
        for value in (0.0, top_rate):
            y = bottom - value / top_rate * (bottom - top)
            draw.text((right + 4, y - 6), _label(value), fill=colour)
        draw.rectangle([legend_x, 8, legend_x + 14, 18], fill=colour)
        draw.text((legend_x + 20, 7), LR_CURVE[1], fill=AXES)
    if panel:
        _draw_quality(draw, quality, x0, x1)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    image.save(partial, format="PNG")
    os.replace(partial, out)
    return True


def _draw_quality(draw: ImageDraw.ImageDraw, quality: dict[str, list[tuple[int, float]]],
                  x0: int, x1: int) -> None:
    """The panel below the chart: each metric over the chart's steps, from its own
    minimum (bottom) to its maximum (top); FID falls as images improve, the others rise."""
    left, right = MARGIN_LEFT, WIDTH - MARGIN_RIGHT
    top, bottom = HEIGHT + 24, HEIGHT + PANEL_HEIGHT - 16
    draw.rectangle([left, top, right, bottom], outline=AXES)
    draw.text((4, top), "quality", fill=AXES)
    legend_x = left
    for key, label, colour in QUALITY_CURVES:
        values_of = quality[key]
        if not values_of:
            continue
        low, high = min(v for _, v in values_of), max(v for _, v in values_of)
        span = (high - low) or 1.0
        line = [(left + (s - x0) / (x1 - x0) * (right - left),
                 bottom - (v - low) / span * (bottom - top)) for s, v in values_of]
        if len(line) == 1:
            x, y = line[0]
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
        else:
            draw.line(line, fill=colour, width=2)
        text = f"{label} {_label(values_of[0][1])} -> {_label(values_of[-1][1])}"
        draw.rectangle([legend_x, HEIGHT + 4, legend_x + 14, HEIGHT + 14], fill=colour)
        draw.text((legend_x + 20, HEIGHT + 3), text, fill=AXES)
        legend_x += 40 + int(draw.textlength(text))
