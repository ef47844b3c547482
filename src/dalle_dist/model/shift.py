"""--shift_tokens: DALLE-pytorch's token shift (its PreShiftToken), before attention and
before the feed-forward of every block, on the normalised input.

Part of each position's features is replaced by a neighbour's, so a layer sees its
neighbourhood at no attention cost:
  text (<bos> and caption)  the first half of the features comes from the previous
                            position (zeros at <bos>); the rest passes
  image cell (row, col)     the first quarter comes from the cell above (zeros in row 0),
                            the second quarter from the cell to the left (zeros in
                            column 0: no wrap to the row above, and never from the text);
                            the rest passes
Quarters and halves are torch.chunk's sizes (ceil(dim / 4), ceil(dim / 2)), as there.

Cached decoding feeds one image cell at a time; its "above" is one grid row back. Each
shift point keeps a ShiftRow in the layer's cache: the unshifted top and left quarters of
the last `fmap` cells, slot = cell % fmap, read before the new cell overwrites its slot.
The text is always prefilled whole from position 0, where the sequence rule applies.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dalle_dist.errors import ConfigError
from dalle_dist.model.patterns import SequenceLayout


def chunk_size(dim: int, chunks: int) -> int:
    """torch.chunk's chunk size: ceil(dim / chunks)."""
    return -(-dim // chunks)


def check_shift_dim(dim: int) -> None:
    if dim < 4:
        raise ConfigError(f"--shift_tokens needs --dim >= 4 (a top and a left quarter of the "
                          f"features), got {dim}", "raise --dim or drop --shift_tokens")


def shift_sequence(x: Tensor, layout: SequenceLayout) -> Tensor:
    """x [b, n, d] at positions 0..n-1 -> the shifted features, same shape."""
    b, n, d = x.shape
    text, side = layout.text_len, layout.fmap_size
    half, quarter = chunk_size(d, 2), chunk_size(d, 4)
    xt = x[:, :text]
    xt = torch.cat((F.pad(xt[..., :half], (0, 0, 1, -1)), xt[..., half:]), dim=-1)
    if n <= text:
        return xt
    image = x[:, text:]
    m = image.shape[1]
    grid = F.pad(image, (0, 0, 0, side * side - m)).view(b, side, side, d)
    top = F.pad(grid[..., :quarter], (0, 0, 0, 0, 1, -1))  # row r <- row r - 1
    left = F.pad(grid[..., quarter:2 * quarter], (0, 0, 1, -1))  # col c <- col c - 1
    grid = torch.cat((top, left, grid[..., 2 * quarter:]), dim=-1)
    return torch.cat((xt, grid.view(b, side * side, d)[:, :m]), dim=1)


class ShiftRow(nn.Module):
    """The top and left quarters of the last grid row's cells, for one shift point.

    A buffer of static shape [batch, fmap, 2 * quarter], written in place at a cell tensor,
    so the compiled decode step keeps one graph. Zeros at first; stale slots from an
    earlier sample are never read (row 0 takes no top, column 0 no left).
    """

    def __init__(self, batch: int, layout: SequenceLayout, dim: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.side = layout.fmap_size
        self.quarter = chunk_size(dim, 4)
        self.register_buffer(
            "row", torch.zeros(batch, self.side, 2 * self.quarter, device=device, dtype=dtype),
            persistent=False)

    def step(self, x: Tensor, cell: Tensor) -> Tensor:
        """x [b, 1, d] of image `cell` ([1]) -> its shifted features."""
        q, side = self.quarter, self.side
        slot = cell % side
        above = self.row.index_select(1, slot)[..., :q].to(x.dtype)  # written at cell - side
        before = self.row.index_select(1, (cell - 1) % side)[..., q:].to(x.dtype)
        top = torch.where(cell >= side, above, torch.zeros_like(above))
        left = torch.where(slot > 0, before, torch.zeros_like(before))
        self.row.index_copy_(1, slot, x[..., :2 * q].to(self.row.dtype))
        return torch.cat((top, left, x[..., 2 * q:]), dim=-1)


class ShiftRows(nn.Module):
    """A block's two shift points (before attention, before the feed-forward)."""

    def __init__(self, batch: int, layout: SequenceLayout, dim: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.attn = ShiftRow(batch, layout, dim, device, dtype)
        self.ff = ShiftRow(batch, layout, dim, device, dtype)


def shift_tokens(x: Tensor, layout: SequenceLayout, row: ShiftRow | None = None,
                 positions: Tensor | None = None) -> Tensor:
    """Shift x [b, n, d]: without a cache, positions 0..n-1. With one (`row`), either a
    prefill of the text from position 0 (n > 1) or one decode step at an image position
    (n == 1; `positions` [1]). Decided on shapes alone: nothing reads a device value."""
    if row is None or x.shape[1] > 1:
        if row is not None and x.shape[1] > layout.text_len:
            raise ValueError("a cached prefill with --shift_tokens holds the text only")
        return shift_sequence(x, layout)
    if positions is None:
        raise ValueError("a cached decode step needs the position of its token")
    return row.step(x, positions - layout.text_len)
