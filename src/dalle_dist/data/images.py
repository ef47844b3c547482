"""Image conversions and grids (PIL + torch only; torchvision is not a dependency)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from dalle_dist.fileio import atomic_writer

#: PIL mode of images with this many channels (4: --transparent)
MODES = {3: "RGB", 4: "RGBA"}


def to_mode(image: Image.Image, channels: int = 3) -> Image.Image:
    """Any PIL image -> RGB (alpha dropped, as DALLE-pytorch does) or, for 4 channels,
    RGBA: alpha kept, and images without alpha (RGB, L, P without transparency) get
    alpha 1 (opaque)."""
    mode = MODES[channels]
    return image if image.mode == mode else image.convert(mode)


def to_rgb(image: Image.Image) -> Image.Image:
    """L, LA, P, RGBA, CMYK ... -> RGB (alpha is dropped, as DALLE-pytorch does)."""
    return to_mode(image, 3)


def pil_to_tensor(image: Image.Image, channels: int = 3) -> torch.Tensor:
    """PIL image -> [channels, H, W] float in [0, 1] (RGB, or RGBA for 4 channels)."""
    array = np.asarray(to_mode(image, channels), dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def tensor_to_pil(image: torch.Tensor) -> Image.Image:
    """[3, H, W] or [4, H, W] in [0, 1] -> RGB or RGBA PIL image (alpha kept)."""
    array = (image.detach().float().clamp(0, 1) * 255).round().byte()
    return Image.fromarray(array.permute(1, 2, 0).cpu().numpy(), MODES[image.shape[0]])


def random_resized_crop(image: Image.Image, size: int, lower_ratio: float,
                        generator: torch.Generator | None = None) -> Image.Image:
    """A random square crop covering [lower_ratio, 1] of the image's area, resized to size.

    Square-only, like DALLE-pytorch's RandomResizedCrop(ratio=(1, 1)).
    """
    w, h = image.size
    fraction = lower_ratio + (1.0 - lower_ratio) * torch.rand((), generator=generator).item()
    side = max(1, min(round(math.sqrt(fraction * w * h)), w, h))
    x = int(torch.randint(0, w - side + 1, (), generator=generator))
    y = int(torch.randint(0, h - side + 1, (), generator=generator))
    return image.resize((size, size), Image.Resampling.BICUBIC, box=(x, y, x + side, y + side))


def center_crop(image: Image.Image, size: int) -> Image.Image:
    """The largest centred square, resized to size: the one crop held-out data is read with."""
    w, h = image.size
    side = min(w, h)
    x, y = (w - side) // 2, (h - side) // 2
    return image.resize((size, size), Image.Resampling.BICUBIC, box=(x, y, x + side, y + side))


def make_grid(images: torch.Tensor, nrow: int | None = None, pad: int = 2,
              min_cell: int = 64) -> Image.Image:
    """[b, 3, H, W] in [0, 1] -> one PIL image with the pictures in rows of nrow; with 4
    channels an RGBA grid whose pictures keep their alpha (the gaps are transparent).

    Pictures smaller than min_cell are enlarged by a whole factor (nearest neighbour, so
    every pixel stays visible): a grid of 32 px shapes is otherwise too small to look at.
    """
    b, channels, h, w = images.shape
    scale = max(1, min_cell // max(h, w))
    h, w = h * scale, w * scale
    nrow = nrow or max(1, math.ceil(math.sqrt(b)))
    rows = math.ceil(b / nrow)
    background = (255, 255, 255, 0) if channels == 4 else (255, 255, 255)
    grid = Image.new(MODES[channels], (nrow * (w + pad) + pad, rows * (h + pad) + pad),
                     background)
    for i in range(b):
        r, c = divmod(i, nrow)
        cell = tensor_to_pil(images[i]).resize((w, h), Image.Resampling.NEAREST)
        grid.paste(cell, (pad + c * (w + pad), pad + r * (h + pad)))
    return grid


def save_png(image: Image.Image, path: str | Path) -> None:
    """Write a PNG atomically."""
    with atomic_writer(path) as f:
        image.save(f, format="PNG")
