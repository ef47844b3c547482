"""The built-in `shapes` dataset: coloured shapes on a plain background, with captions.

Every image is a pure function of (seed, index): the same seed gives the same pixels and
captions on any machine, so runs and tests need no download. Captions read like
"a small red circle on the left"; fidelity (data.scorer) checks colour and shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import Dataset

from dalle_dist.data.images import pil_to_tensor

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (40, 70, 230),
    "yellow": (235, 205, 20),
    "purple": (140, 50, 190),
    "cyan": (30, 195, 210),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
#: Shape side as a fraction of the image side.
SIZES: dict[str, float] = {"small": 0.32, "large": 0.52}
#: Shape centre (x, y) as fractions of the image side.
POSITIONS: dict[str, tuple[float, float]] = {
    "on the left": (0.28, 0.5),
    "on the right": (0.72, 0.5),
    "at the top": (0.5, 0.28),
    "at the bottom": (0.5, 0.72),
    "in the center": (0.5, 0.5),
}
BACKGROUND: tuple[int, int, int] = (240, 240, 240)
#: Rendering is done this many times larger, then downsampled, for clean edges.
SUPERSAMPLE = 4


@dataclass(frozen=True)
class ShapeSpec:
    """One scene: what the caption says, plus the jitter it does not."""

    colour: str
    shape: str
    size: str
    position: str
    dx: float = 0.0  # centre jitter, fraction of the image side
    dy: float = 0.0
    scale: float = 1.0  # size jitter

    @property
    def caption(self) -> str:
        return f"a {self.size} {self.colour} {self.shape} {self.position}"


def shape_polygon(shape: str, box: tuple[float, float, float, float]) -> list[tuple[float, float]]:
    """Vertices of a square or upward triangle filling `box` (x0, y0, x1, y1)."""
    x0, y0, x1, y1 = box
    if shape == "square":
        return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
    if shape == "triangle":
        return [((x0 + x1) / 2, y0), (x1, y1), (x0, y1)]
    raise ValueError(shape)


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: tuple[float, float, float, float],
               fill: tuple[int, ...] | int) -> None:
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    else:
        draw.polygon(shape_polygon(shape, box), fill=fill)


def render(spec: ShapeSpec, image_size: int) -> Image.Image:
    """Draw `spec` on a plain background, anti-aliased by supersampling."""
    big = image_size * SUPERSAMPLE
    image = Image.new("RGB", (big, big), BACKGROUND)
    cx, cy = POSITIONS[spec.position]
    half = SIZES[spec.size] * spec.scale * big / 2
    centre_x, centre_y = (cx + spec.dx) * big, (cy + spec.dy) * big
    box = (centre_x - half, centre_y - half, centre_x + half, centre_y + half)
    draw_shape(ImageDraw.Draw(image), spec.shape, box, COLOURS[spec.colour])
    return image.resize((image_size, image_size), Image.Resampling.BOX)


def sample_spec(seed: int, index: int) -> ShapeSpec:
    """The scene at `index` of the dataset drawn with `seed`."""
    rng = np.random.default_rng([seed, index])
    return ShapeSpec(
        colour=list(COLOURS)[rng.integers(len(COLOURS))],
        shape=SHAPES[rng.integers(len(SHAPES))],
        size=list(SIZES)[rng.integers(len(SIZES))],
        position=list(POSITIONS)[rng.integers(len(POSITIONS))],
        dx=float(rng.uniform(-0.04, 0.04)),
        dy=float(rng.uniform(-0.04, 0.04)),
        scale=float(rng.uniform(0.9, 1.1)),
    )


class ShapesDataset(Dataset):
    """`count` scenes drawn from `seed`; item i is (image [C, S, S] in [0, 1], caption),
    C = 3, or 4 with an opaque alpha channel for a --transparent VAE.

    indices: the scenes this dataset holds (a part of a held-out split); default all."""

    def __init__(self, count: int = 10_000, image_size: int = 32, seed: int = 0,
                 channels: int = 3, indices: list[int] | None = None) -> None:
        self.count, self.image_size, self.seed = count, image_size, seed
        self.channels = channels
        self.indices = indices

    def __len__(self) -> int:
        return self.count if self.indices is None else len(self.indices)

    def spec(self, index: int) -> ShapeSpec:
        return sample_spec(self.seed, index)

    def caption_lines(self, index: int) -> list[str]:
        """The one caption of scene `index` of this dataset."""
        return [self.spec(index if self.indices is None else self.indices[index]).caption]

    def keys(self) -> list[str]:
        """Each scene's name for the held-out split: its index in the full dataset."""
        return [str(i) for i in (range(self.count) if self.indices is None else self.indices)]

    def subset(self, indices: list[int], evaluation: bool = False) -> ShapesDataset:
        """The scenes at `indices` of this one (shapes are drawn the same way every time)."""
        held = range(self.count) if self.indices is None else self.indices
        return ShapesDataset(self.count, self.image_size, self.seed, self.channels,
                             [held[i] for i in indices])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, str]:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} images")
        spec = self.spec(index if self.indices is None else self.indices[index])
        return pil_to_tensor(render(spec, self.image_size), self.channels), spec.caption

    def captions(self) -> list[str]:
        """Every caption the generator can write (the longest bounds --text_seq_len)."""
        return [ShapeSpec(c, s, z, p).caption
                for c in COLOURS for s in SHAPES for z in SIZES for p in POSITIONS]
