"""Grids and conversions of dalle_dist.data.images."""

from __future__ import annotations

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
