"""Grids and conversions of dalle_dist.data.images."""

from __future__ import annotations

import numpy as np
import torch

from dalle_dist.data.images import make_grid, pil_to_tensor, tensor_to_pil


def test_grid_enlarges_small_pictures_by_whole_factors() -> None:
    images = torch.rand(5, 3, 16, 16)
    grid = make_grid(images, nrow=3, pad=2)
    cell = 64  # 16 px pictures are drawn 4x, nearest neighbour
    assert grid.size == (3 * (cell + 2) + 2, 2 * (cell + 2) + 2)
    first = pil_to_tensor(grid.crop((2, 2, 2 + cell, 2 + cell)))
    expected = pil_to_tensor(tensor_to_pil(images[0]))
    assert torch.equal(first[:, ::4, ::4], expected), "each pixel becomes a 4x4 block"


def test_grid_keeps_large_pictures_at_their_size() -> None:
    grid = make_grid(torch.zeros(2, 3, 80, 80), nrow=2, pad=0)
    assert grid.size == (160, 80)


def test_tensor_pil_round_trip_is_exact_for_8_bit_values() -> None:
    image = torch.randint(0, 256, (3, 8, 8)).float() / 255
    assert torch.allclose(pil_to_tensor(tensor_to_pil(image)), image, atol=1e-6)


# -- --transparent: RGBA -------------------------------------------------------------------

def test_rgba_keeps_alpha_and_opaque_images_get_alpha_one() -> None:
    """Bug caught: alpha dropped (to_rgb) or, for RGB files, left at 0 (invisible)."""
    from PIL import Image

    rgba = Image.new("RGBA", (4, 4), (10, 20, 30, 77))
    t = pil_to_tensor(rgba, channels=4)
    assert t.shape == (4, 4, 4) and torch.allclose(t[3], torch.full((4, 4), 77 / 255))
    assert pil_to_tensor(rgba).shape[0] == 3  # without --transparent, as before
    opaque = pil_to_tensor(Image.new("RGB", (4, 4), (1, 2, 3)), channels=4)
    assert torch.equal(opaque[3], torch.ones(4, 4))
    back = tensor_to_pil(t)
    assert back.mode == "RGBA" and back.getpixel((0, 0)) == (10, 20, 30, 77)


def test_rgba_grid_keeps_each_pictures_alpha() -> None:
    images = torch.rand(3, 4, 16, 16)
    grid = make_grid(images, nrow=3, pad=2)
    assert grid.mode == "RGBA"
    cell = pil_to_tensor(grid.crop((2, 2, 66, 66)), channels=4)
    assert torch.equal(cell[:, ::4, ::4], pil_to_tensor(tensor_to_pil(images[0]), channels=4))
    assert grid.getpixel((0, 0))[3] == 0  # the gaps are transparent


def test_folder_loads_alpha_with_four_channels(tmp_path) -> None:
    """Bug caught: the folder loader converting to RGB whatever the VAE's channels."""
    from PIL import Image

    from dalle_dist.data.folder import TextImageFolder

    alpha = np.arange(64, dtype=np.uint8).reshape(8, 8) * 4
    pixels = np.dstack([np.full((8, 8), 200, np.uint8)] * 3 + [alpha])
    Image.fromarray(pixels, "RGBA").save(tmp_path / "a.png")
    (tmp_path / "a.txt").write_text("a shape")
    Image.new("RGB", (8, 8), (9, 9, 9)).save(tmp_path / "b.png")
    (tmp_path / "b.txt").write_text("a grey square")
    data = TextImageFolder(tmp_path, 8, resize_ratio=1.0, channels=4)
    image, _ = data[0]
    assert image.shape == (4, 8, 8)
    assert torch.allclose(image[3], torch.from_numpy(alpha / 255).float(), atol=1e-6)
    assert torch.equal(data[1][0][3], torch.ones(8, 8))
    assert TextImageFolder(tmp_path, 8, resize_ratio=1.0)[0][0].shape[0] == 3
