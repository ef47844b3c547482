"""NAME-loss.png: the training loss and, when logged, the validation loss over steps, and
the learning rate on a scale of its own (right) when it changes (warmup, decay).

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


def read_curves(metrics: Path) -> dict[str, list[tuple[int, float]]]:
    """(step, value) pairs of each curve's key, by step; unreadable lines are skipped (a
    crash can leave the last one cut)."""
    by_key: dict[str, dict[int, float]] = {key: {} for key, _, _ in (*CURVES, LR_CURVE)}
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
    """Redraw `out` from `metrics`; False (nothing written) while no loss is logged yet.
    Written to a temporary file and renamed, so a viewer never sees half a PNG."""
    curves = read_curves(metrics)
    rates = curves.pop(LR_CURVE[0])
    points = [p for values in curves.values() for p in values]
    if not curves["loss"]:
        return False
    steps = [s for s, _ in points]
    values = [v for _, v in points]
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

    image = Image.new("RGB", (WIDTH, HEIGHT), BACKGROUND)
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
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    image.save(partial, format="PNG")
    os.replace(partial, out)
    return True
