"""Caption fidelity for the built-in shapes: what colour and shape is in this picture?

Plain image analysis, no learned model, so it cannot share a generator's mistakes:
the background is the border's median colour; pixels are labelled with the nearest palette
colour; the majority foreground colour wins; its largest connected region is compared
(intersection over union) with a circle, a square and a triangle drawn in its bounding box.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageDraw

from dalle_dist.data.shapes import BACKGROUND, COLOURS, SHAPES, SUPERSAMPLE, draw_shape

_NAMES = list(COLOURS)
_PALETTE = np.array([*COLOURS.values(), BACKGROUND], dtype=np.float32)
#: A pixel this far (RGB, 0..255) from the background belongs to the foreground.
_FOREGROUND_DISTANCE = 60.0


@dataclass(frozen=True)
class Verdict:
    colour: str | None
    shape: str | None


def _to_array(image: torch.Tensor | Image.Image | np.ndarray) -> np.ndarray:
    """-> [H, W, 3] float32 in 0..255."""
    if isinstance(image, torch.Tensor):
        return image.detach().float().clamp(0, 1).permute(1, 2, 0).cpu().numpy() * 255.0
    return np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image,
                      dtype=np.float32)


def _largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest 4-connected region of a boolean mask."""
    seen = np.zeros_like(mask)
    best: list[tuple[int, int]] = []
    h, w = mask.shape
    for start in zip(*np.nonzero(mask), strict=True):
        if seen[start]:
            continue
        seen[start] = True
        region, queue = [], deque([start])
        while queue:
            r, c = queue.popleft()
            region.append((r, c))
            for nr, nc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
                if 0 <= nr < h and 0 <= nc < w and mask[nr, nc] and not seen[nr, nc]:
                    seen[nr, nc] = True
                    queue.append((nr, nc))
        if len(region) > len(best):
            best = region
    out = np.zeros_like(mask)
    rows, cols = zip(*best, strict=True)
    out[list(rows), list(cols)] = True
    return out


def _template(shape: str, box: tuple[int, int, int, int], size: tuple[int, int]) -> np.ndarray:
    """Pixels more than half covered by `shape` drawn to fill box (x0, y0, x1, y1)."""
    s = SUPERSAMPLE
    canvas = Image.new("L", (size[1] * s, size[0] * s), 0)
    draw_shape(ImageDraw.Draw(canvas), shape, tuple(v * s for v in box), 255)
    coverage = np.asarray(canvas.resize((size[1], size[0]), Image.Resampling.BOX))
    return coverage > 127


def predict(image: torch.Tensor | Image.Image | np.ndarray) -> Verdict:
    """The colour and shape in one picture ([3, H, W] in [0, 1], PIL, or HxWx3 uint8)."""
    pixels = _to_array(image)
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    background = np.median(border, axis=0)
    foreground = np.linalg.norm(pixels - background, axis=-1) > _FOREGROUND_DISTANCE
    if foreground.sum() < 3:
        return Verdict(None, None)
    labels = np.linalg.norm(pixels[..., None, :] - _PALETTE, axis=-1).argmin(axis=-1)
    votes = np.bincount(labels[foreground], minlength=len(_PALETTE))[: len(_NAMES)]
    if votes.sum() == 0:
        return Verdict(None, None)
    colour_index = int(votes.argmax())
    region = _largest_component((labels == colour_index) & foreground)
    rows, cols = np.nonzero(region)
    box = (int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1)
    scores = {}
    for shape in SHAPES:
        template = _template(shape, box, region.shape)
        union = (template | region).sum()
        scores[shape] = (template & region).sum() / union if union else 0.0
    return Verdict(_NAMES[colour_index], max(scores, key=scores.get))


def parse_caption(caption: str) -> Verdict:
    """The colour and shape a caption asks for (None where it names none)."""
    words = caption.lower().split()
    colour = next((w for w in words if w in COLOURS), None)
    shape = next((w for w in words if w in SHAPES), None)
    return Verdict(colour, shape)


def fidelity(images: torch.Tensor | Sequence[torch.Tensor | Image.Image],
             captions: Sequence[str]) -> float:
    """Fraction of images whose predicted colour and shape both match their caption."""
    if len(images) != len(captions):
        raise ValueError(f"{len(images)} images but {len(captions)} captions")
    if not captions:
        return 0.0
    pairs = zip(images, captions, strict=True)
    hits = sum(predict(image) == parse_caption(caption) for image, caption in pairs)
    return hits / len(captions)
