"""Attention patterns: which earlier positions each query may attend to.

Each pattern is ONE elementwise rule, `allowed(layout, q, k)`, over integer position
tensors that broadcast against each other. Every attention path reads that rule: the
dense masks (`mask`), the KV-cached decoding rows, FlexAttention's mask_mod, and the
key sets of the gather paths (which tests check against the rule).

Layout: positions 0..text_len-1 hold <bos> and the caption; image cell j (row-major over
an s x s grid) sits at text_len + j. Everything is causal; text attends to earlier text
in every pattern; the pattern decides which earlier image cells an image query sees:
  full       all of them
  axial_row  those of its own row
  axial_col  those of its own column
  conv_like  those inside its k x k window (dilation d), centred on it
  sparse     block-sparse over the whole sequence, DeepSpeed VariableSparsityConfig style:
             16-token blocks; global blocks covering the text; fixed local windows of 4
             blocks; `random_blocks` random earlier blocks per block, drawn from a seed.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from dalle_dist.errors import ConfigError


@dataclass(frozen=True)
class SequenceLayout:
    """Where text and image tokens sit in the transformer's input.

    The last image token is only ever predicted, never fed, so a training sequence is one
    shorter than text + image.
    """

    text_len: int
    fmap_size: int

    @property
    def image_len(self) -> int:
        return self.fmap_size**2

    @property
    def seq_len(self) -> int:
        return self.text_len + self.image_len - 1


class AttentionPattern:
    name: ClassVar[str]
    #: True when the rule is exactly "key <= query" (SDPA's is_causal can stand in).
    causal_only: ClassVar[bool] = False

    def allowed(self, layout: SequenceLayout, q: Tensor, k: Tensor) -> Tensor:
        """May the query at position q see the key at position k? (broadcasting tensors)"""
        text = layout.text_len
        image_rule = self.image_rule(layout, q - text, k - text)
        return (k <= q) & ((k < text) | ((q >= text) & image_rule))

    def image_rule(self, layout: SequenceLayout, jq: Tensor, jk: Tensor) -> Tensor:
        """For an image query at cell jq and an earlier image key at cell jk."""
        raise NotImplementedError

    @property
    def key(self) -> tuple[object, ...]:
        """The pattern's value: equal keys, equal rules (layers share FlexAttention masks
        and their compiled kernel by it)."""
        return (self.name,)

    def bound_rule(self, layout: SequenceLayout,
                   device: torch.device) -> Callable[[Tensor, Tensor], Tensor]:
        """`allowed` for one layout and device, with any lookup table already fetched:
        a traced caller (FlexAttention's mask_mod under torch.compile) then sees only
        tensor arithmetic, never this object's caches."""
        return functools.partial(self.allowed, layout)

    def mask(self, layout: SequenceLayout, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Boolean [len(q_pos), len(k_pos)]."""
        return self.allowed(layout, q_pos[:, None], k_pos[None, :])

    def full_mask(self, layout: SequenceLayout, length: int, device: torch.device) -> Tensor:
        """The [length, length] mask of a sequence starting at position 0."""
        pos = torch.arange(length, device=device)
        return self.mask(layout, pos, pos)


class FullPattern(AttentionPattern):
    name = "full"
    causal_only = True

    def image_rule(self, layout: SequenceLayout, jq: Tensor, jk: Tensor) -> Tensor:
        return torch.ones_like(jq + jk, dtype=torch.bool)


class AxialRowPattern(AttentionPattern):
    name = "axial_row"

    def image_rule(self, layout: SequenceLayout, jq: Tensor, jk: Tensor) -> Tensor:
        s = layout.fmap_size
        return torch.div(jq, s, rounding_mode="floor") == torch.div(jk, s, rounding_mode="floor")


class AxialColPattern(AttentionPattern):
    name = "axial_col"

    def image_rule(self, layout: SequenceLayout, jq: Tensor, jk: Tensor) -> Tensor:
        s = layout.fmap_size
        return torch.remainder(jq, s) == torch.remainder(jk, s)


class ConvLikePattern(AttentionPattern):
    name = "conv_like"

    def __init__(self, kernel_size: int = 5, dilation: int = 1) -> None:
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ConfigError(f"--conv_kernel_size must be odd and positive, got {kernel_size}")
        if dilation < 1:
            raise ConfigError(f"--conv_dilation must be positive, got {dilation}")
        self.kernel_size, self.dilation = kernel_size, dilation

    @property
    def key(self) -> tuple[object, ...]:
        return (self.name, self.kernel_size, self.dilation)

    @property
    def reach(self) -> int:
        """How many rows (and columns) back from the query the window extends.

        DALLE-pytorch's window (SparseConvCausalAttention, 1.6.6): the k x k grid of cells
        (dilated) whose bottom-right corner is the query, i.e. rows r - (k-1)d .. r and
        columns c - (k-1)d .. c, all before the query in raster order. It pads the grid
        by 2 x (k // 2) x d on the top and the left and unfolds, so a window that would
        reach past the grid's edge loses those cells."""
        return (self.kernel_size - 1) * self.dilation

    def image_rule(self, layout: SequenceLayout, jq: Tensor, jk: Tensor) -> Tensor:
        s, d = layout.fmap_size, self.dilation
        dr = torch.div(jq, s, rounding_mode="floor") - torch.div(jk, s, rounding_mode="floor")
        dc = torch.remainder(jq, s) - torch.remainder(jk, s)
        return ((dr >= 0) & (dr <= self.reach) & (dc >= 0) & (dc <= self.reach)
                & (torch.remainder(dr, d) == 0) & (torch.remainder(dc, d) == 0))


class SparsePattern(AttentionPattern):
    name = "sparse"
    BLOCK = 16
    LOCAL_WINDOW_BLOCKS = 4

    def __init__(self, random_blocks: int | None = None, seed: int = 0) -> None:
        if random_blocks is not None and random_blocks < 0:
            raise ConfigError(f"--sparse_random_blocks must be >= 0, got {random_blocks}")
        self.random_blocks, self.seed = random_blocks, seed
        self._layouts: dict[tuple[SequenceLayout, str], Tensor] = {}

    @property
    def key(self) -> tuple[object, ...]:
        return (self.name, self.random_blocks, self.seed)

    def num_random_blocks(self, layout: SequenceLayout) -> int:
        """DALLE-pytorch's default: a quarter of the sequence's blocks."""
        if self.random_blocks is not None:
            return self.random_blocks
        return math.ceil(layout.seq_len / self.BLOCK) // 4

    def block_layout(self, layout: SequenceLayout, device: torch.device) -> Tensor:
        """Boolean [blocks, blocks]: may query block i attend key block j (before causality)."""
        key = (layout, str(device))
        if key not in self._layouts:
            blocks = math.ceil((layout.seq_len + 1) / self.BLOCK)
            grid = torch.zeros(blocks, blocks, dtype=torch.bool)
            for g in range(math.ceil(layout.text_len / self.BLOCK)):  # global: the text
                grid[g:, g] = True
            w = self.LOCAL_WINDOW_BLOCKS
            for start in range(0, blocks, w):  # fixed local windows, causal inside
                for row in range(start, min(start + w, blocks)):
                    grid[row, start:row + 1] = True
            rng = random.Random(self.seed)
            for row in range(blocks):
                count = min(self.num_random_blocks(layout), row + 1)
                grid[row, rng.sample(range(row + 1), count)] = True
            self._layouts[key] = grid.to(device)
        return self._layouts[key]

    def allowed(self, layout: SequenceLayout, q: Tensor, k: Tensor) -> Tensor:
        return self.allowed_by(self.block_layout(layout, q.device), q, k)

    def allowed_by(self, grid: Tensor, q: Tensor, k: Tensor) -> Tensor:
        """The rule given the layout's block grid (`block_layout`)."""
        b = self.BLOCK
        q_block = torch.div(q, b, rounding_mode="floor")
        return (k <= q) & grid[q_block, torch.div(k, b, rounding_mode="floor")]

    def bound_rule(self, layout: SequenceLayout,
                   device: torch.device) -> Callable[[Tensor, Tensor], Tensor]:
        return functools.partial(self.allowed_by, self.block_layout(layout, device))


PATTERNS: dict[str, type[AttentionPattern]] = {
    cls.name: cls for cls in (FullPattern, AxialRowPattern, AxialColPattern, ConvLikePattern,
                              SparsePattern)
}


@dataclass(frozen=True)
class PatternOptions:
    """The knobs of the patterns that have any (DALLE-pytorch's defaults)."""

    conv_kernel_size: int = 5
    conv_dilation: int = 1
    sparse_random_blocks: int | None = None
    sparse_seed: int = 0


def build_pattern(name: str, options: PatternOptions | None = None) -> AttentionPattern:
    """The pattern called `name`; an unknown name is a user error that lists the valid ones."""
    options = options or PatternOptions()
    if name not in PATTERNS:
        known = ", ".join(PATTERNS)
        raise ConfigError(f"unknown attention pattern {name!r} in --attn_types",
                          f"valid: {known}")
    if name == "conv_like":
        return ConvLikePattern(options.conv_kernel_size, options.conv_dilation)
    if name == "sparse":
        return SparsePattern(options.sparse_random_blocks, options.sparse_seed)
    return PATTERNS[name]()
